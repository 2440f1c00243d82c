#!/usr/bin/env bash
# The GPU check (docs/testing.md, "The GPU check"): one command for the GPU machine, from the repository root:
#
#     bash scripts/gpu_check.sh
#
# Steps: `lit_entropy.callbacks` resolvable from the checkout;
# the missing pure-Python packages from gpu-wheels/ (`make gpu-wheels`) installed into a private folder;
# versions and device; the lab on CUDA with rollout=hf in five variants (fp32, bf16, fp16, LoRA, FSDP2 on one
# rank); the model-family conformance suite on CUDA kernels; the `gpu`-marked tests. Every step runs under
# `timeout` and all of them within GPU_CHECK_BUDGET seconds (default 540), so the summary always comes back.
# Writes $OUT/gpu_check.md (each step passed, failed or skipped, with its reason, seconds and figures), the
# steps' logs under $OUT/logs/ and the lab runs' logs and event files under $OUT/lab/. Without a CUDA device
# every CUDA step is skipped ("no CUDA device") and the rest takes seconds.
# Exit status: 0 when no step failed (skips are fine), 1 otherwise.
#
# Environment: OUT (default gpu_check_out/), PYTHON (default python, else python3), GPU_WHEELS (default
# gpu-wheels/), GPU_CHECK_BUDGET (seconds), GPU_CHECK_SITE (where the wheels go; default a temporary folder),
# GPU_CHECK_ONLY (steps to run, e.g. "wheels conformance"; "lab" names the five lab runs; default all).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-540}
DEADLINE=$((START + BUDGET))
if [ -n "${OUT:-}" ]; then
    OUT_WHERE="\$OUT ($OUT)"
else
    OUT=$ROOT/gpu_check_out
    OUT_WHERE="gpu_check_out/ (\$OUT was unset)"
fi
mkdir -p "$OUT/logs" "$OUT/lab"
PYTHON=${PYTHON:-$(command -v python || command -v python3)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
SITE=${GPU_CHECK_SITE:-$WORK/gpu_site}
WHEELS=${GPU_WHEELS:-$ROOT/gpu-wheels}
HELPER=$ROOT/scripts/gpu_check.py
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}" GPU_CHECK_SITE_DIR=$SITE
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1
cleanup() {
    rm -rf "$WORK"
}
trap cleanup EXIT

ROWS=()
FAILED=0
HAS_CUDA=""  # 1 or 0 once known (the versions step, else the first CUDA step asks torch)
LAB_ROWS=()
render() {  # the summary, rewritten after every step (a cut-off run still leaves one)
    local passed=0 failed=0 skipped=0 row
    for row in "${ROWS[@]}"; do
        case "$row" in
            *"| passed |"*) passed=$((passed + 1)) ;;
            *"| failed |"*) failed=$((failed + 1)) ;;
            *"| skipped |"*) skipped=$((skipped + 1)) ;;
        esac
    done
    {
        echo "# GPU check"
        echo
        echo "Started $(date -u -d "@$START" '+%Y-%m-%d %H:%M:%S UTC' 2>/dev/null || echo "$START") on $(hostname)," \
             "$(( $(date +%s) - START )) s so far of a ${BUDGET} s budget. Output: $OUT_WHERE."
        echo "Steps: $passed passed, $failed failed, $skipped skipped."
        echo
        echo "| step | result | seconds | note |"
        echo "|---|---|---|---|"
        printf '%s\n' "${ROWS[@]}"
        for section in versions lab tests; do
            if [ -s "$WORK/$section.md" ]; then echo; cat "$WORK/$section.md"; fi
        done
    } > "$OUT/gpu_check.md"
}
record() {  # record STEP RESULT SECONDS NOTE
    local note=${4//|/\\|}
    ROWS+=("| $1 | $2 | $3 | ${note//$'\n'/; } |")
    if [ "$2" = failed ]; then FAILED=1; fi
    echo "gpu_check: $1 $2 ($3 s) ${4//$'\n'/; }"
    render
}
want() {  # want STEP [cuda]: 0 when STEP is to run; else records why it is skipped and returns 1
    local only=" ${GPU_CHECK_ONLY:-} "
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ "$only" != *" $1 "* ]] && ! [[ "$1" == lab-* && "$only" == *" lab "* ]]; then
        record "$1" skipped 0 "not in GPU_CHECK_ONLY ($GPU_CHECK_ONLY)"
        return 1
    fi
    if [ "${2:-}" != cuda ]; then return 0; fi
    if [ -z "$HAS_CUDA" ]; then
        HAS_CUDA=$("$PYTHON" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
    fi
    if [ "$HAS_CUDA" = 1 ]; then return 0; fi
    record "$1" skipped 0 "no CUDA device"
    return 1
}
run() {  # run STEP BOUND CMD...: CMD under timeout into logs/STEP.log; sets RC, SECS, WHY (a failure's reason)
    local step=$1 bound=$2 left t0
    shift 2
    left=$((DEADLINE - $(date +%s) - 10))
    if [ "$left" -lt 20 ]; then
        record "$step" skipped 0 "out of the time budget (GPU_CHECK_BUDGET=$BUDGET s)"
        return 1
    fi
    if [ "$bound" -gt "$left" ]; then bound=$left; fi
    t0=$(date +%s)
    timeout -k 10 "$bound" "$@" > "$OUT/logs/$step.log" 2>&1
    RC=$?
    SECS=$(( $(date +%s) - t0 ))
    case $RC in
        0) WHY="" ;;
        124 | 137) WHY="timed out after $bound s" ;;
        *) WHY="exit $RC: $({ grep -E 'Error|Exception' "$OUT/logs/$step.log" || grep -v '^\s*$' "$OUT/logs/$step.log"; } \
               | tail -n 1 | cut -c1-200)" ;;
    esac
    return 0
}

# ---- a. the package from the checkout, and the wheels the machine lacks --------------------------------------
# The package imports from the checkout, installed or not (the checkout is first on PYTHONPATH).
resolves() { "$PYTHON" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)" > /dev/null 2>&1; }
if want package; then
    if resolves lit_entropy.callbacks; then
        record package passed 0 "lit_entropy.callbacks resolves from $(cd "$ROOT" && pwd)"
    else
        record package failed 0 "lit_entropy.callbacks does not resolve with PYTHONPATH=$PYTHONPATH"
    fi
fi
if want wheels && run wheels 120 "$PYTHON" "$HELPER" install "$WHEELS" "$SITE" "$WORK/wheels.note"; then
    note=$(cat "$WORK/wheels.note" 2>/dev/null)
    case $RC in
        0) record wheels passed "$SECS" "$note" ;;
        3) record wheels skipped "$SECS" "$note" ;;
        *) record wheels failed "$SECS" "${note:-$WHY}" ;;
    esac
fi

# ---- b. versions and device ----------------------------------------------------------------------------------
if want versions && run versions 120 "$PYTHON" "$HELPER" versions "$WORK/has_cuda"; then
    if [ "$RC" = 0 ]; then
        { echo "## Versions and device"; echo; cat "$OUT/logs/versions.log"; } > "$WORK/versions.md"
        record versions passed "$SECS" "see Versions and device"
    else
        record versions failed "$SECS" "$WHY"
    fi
    if [ -s "$WORK/has_cuda" ]; then HAS_CUDA=$(cat "$WORK/has_cuda"); fi
fi

# ---- c. the lab on CUDA with rollout=hf ----------------------------------------------------------------------
if want warm-start cuda && run warm-start 180 "$PYTHON" "$HELPER" warm-start; then
    if [ "$RC" = 0 ]; then record warm-start passed "$SECS" "$(tail -n 1 "$OUT/logs/warm-start.log")"
    else record warm-start failed "$SECS" "$WHY"; fi
fi
lab() {  # lab NAME OVERRIDES...
    local name=$1 dir=$WORK/lab/$1 cells status
    shift
    want "lab-$name" cuda || return 0
    run "lab-$name" 120 "$PYTHON" scripts/train.py debug=smoke rollout=hf trainer.max_epochs=2 \
        "paths.log_dir=$dir" "hydra.run.dir=$dir/run" "$@" || return 0
    mkdir -p "$OUT/lab/$name"
    if [ -d "$dir/run" ]; then  # its logs, configs and event files come back (not its checkpoints)
        (cd "$dir/run" && find . \( -name 'events.out.tfevents.*' -o -name '*.log' -o -name '*.yaml' \) \
            -exec cp --parents {} "$OUT/lab/$name/" \;)
    fi
    cells=$("$PYTHON" "$HELPER" figures "$dir/run" 2>> "$OUT/logs/lab-$name.log") || cells="(no figures) |"
    status=passed
    if [ "$RC" != 0 ]; then status=failed; fi
    if [ ${#LAB_ROWS[@]} = 0 ]; then
        LAB_ROWS=("| variant | result | seconds $("$PYTHON" "$HELPER" figures --header)" \
                  "|---|---|---$(printf '|---%.0s' $(seq "$("$PYTHON" "$HELPER" figures --count)"))|")
    fi
    LAB_ROWS+=("| $name | $status | $SECS $cells")
    { echo "## Lab runs (debug=smoke rollout=hf trainer.max_epochs=2)"; echo; printf '%s\n' "${LAB_ROWS[@]}"; } \
        > "$WORK/lab.md"
    record "lab-$name" "$status" "$SECS" "${WHY:-$*}"
}
lab fp32 trainer=gpu precision=fp32
lab bf16 trainer=gpu precision=bf16
lab fp16 trainer=gpu precision=fp16
lab lora trainer=gpu "model.lora={r: 4, alpha: 8}"
lab fsdp trainer=fsdp trainer.accelerator=gpu trainer.devices=1

# ---- d, e. the conformance suite on CUDA kernels, then the gpu-marked tests ----------------------------------
# (in this order: the gpu tier's runs repeat the lab's variants above, so it is the one the budget may cut)
tests() {  # tests STEP BOUND DEVICE PYTEST-ARGS...: DEVICE is the suite's LIT_ENTROPY_TEST_DEVICE
    local step=$1 bound=$2 device=$3 note status
    shift 3
    want "$step" cuda || return 0
    run "$step" "$bound" env "LIT_ENTROPY_TEST_DEVICE=$device" "$PYTHON" -m pytest -q -p no:cacheprovider "$@" \
        || return 0
    note=$("$PYTHON" "$HELPER" pytest-note "$OUT/logs/$step.log")
    case $RC in
        0) status=passed ;;
        5) status=skipped; note="no test selected; $note" ;;
        *) status=failed ;;
    esac
    { echo "## $step: \`pytest $(printf "%q " "$@")\`${device:+ with LIT_ENTROPY_TEST_DEVICE=$device}"; echo; echo '```'
      echo "$note"; echo '```'; echo; } >> "$WORK/tests.md"
    if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then note="$WHY; $note"; fi
    record "$step" "$status" "$SECS" "$(head -n 1 <<< "$note")"
}
tests conformance 240 cuda -m "not gpu" tests/models/test_conformance.py tests/models/test_sliding_window_passes.py
mapfile -t GPU_FILES < <(grep -rl --include='test_*.py' 'mark.gpu' tests | sort)
tests gpu-tests 300 "" -m gpu "${GPU_FILES[@]}"

render
echo
cat "$OUT/gpu_check.md"
exit "$FAILED"
