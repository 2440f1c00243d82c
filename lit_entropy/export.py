"""``lit-entropy-export``: a training checkpoint out of the package, as a plain Hugging Face model folder.

A run's weights live in a Lightning checkpoint (``<run>/checkpoints/*.ckpt``, the policy under the
``state_dict`` keys ``model.*``), which neither transformers nor vLLM can read. This module rebuilds the
run's policy exactly as evaluation does (:func:`lit_entropy.policy.from_run.build_policy`: the ``model``
group of the run's ``.hydra/config.yaml``, the checkpoint's weights loaded into it), merges LoRA adapters
into the base weights (``W + B·A·alpha/r``, what the weight sync handed the rollout engine), and writes
``config.json``, ``model.safetensors``, the tokenizer with its chat template, ``generation_config.json``
(the tokenizer's BOS/EOS/pad ids: the EOS the run stopped its samples at) and ``export.json`` (where the
folder came from). ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load the
folder without this package; vLLM serves it.

The folder is written under a temporary name beside ``out_dir`` and renamed into place, so a failed export
never leaves half a model where a loader would find it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from lit_entropy.policy.from_run import build_policy, find_run_config
from lit_entropy.policy.lora import is_peft
from lit_entropy.policy.models import HFTokenizerAdapter, PolicyBundle
from lit_entropy.policy.tokenizer import CharTokenizer
from lit_entropy.utils.checkpointing import UnsafeCheckpointError, load_checkpoint

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""``--dtype`` choices. fp32 is the default: the weights as the trainer held them (training in fp32, or
bf16 weights widened exactly); bf16/fp16 halve the folder for serving."""
RECORD = "export.json"
SHA256_MAX_BYTES = 4 << 30
"""Checkpoints up to this size get a sha256 in ``export.json`` (a few seconds); larger ones (optimizer states
of big models) are identified by size and mtime, so an export does not spend minutes hashing."""
HF_POLICIES = "model=hf / model=smollm2_135m"
TRUST_FLAG = "--trust-checkpoint"
"""The command line's opt-in to a full unpickling of the checkpoint (lit_entropy/utils/checkpointing.py)."""


class ExportError(ValueError):
    """The checkpoint cannot be exported as asked; the message names why and what to do."""


def export_checkpoint(ckpt_path: str | os.PathLike, out_dir: str | os.PathLike, *, dtype: str = "fp32",
                      force: bool = False, model_dir: str | os.PathLike | None = None, trust: bool = False) -> Path:
    """Write the policy of the training checkpoint ``ckpt_path`` as a Hugging Face folder ``out_dir``.

    ``dtype``: ``fp32`` | ``bf16`` | ``fp16`` of the saved weights. ``force``: replace a non-empty ``out_dir``
    (refused otherwise, so an export never silently mixes with another model's files). ``model_dir``: the base
    model's folder (a Hugging Face folder or hub id) — for a checkpoint without its run's
    ``.hydra/config.yaml``, or to point a moved run at a local copy of its base. ``trust``: load a checkpoint that
    a weights-only load refuses with full unpickling (it may run code; :func:`lit_entropy.utils.checkpointing.load_checkpoint`).
    Returns ``out_dir``.
    """
    ckpt, out = Path(ckpt_path), Path(out_dir)
    if dtype not in DTYPES:
        raise ExportError(f"dtype={dtype!r} must be one of {sorted(DTYPES)}")
    if ckpt.is_dir():
        raise ExportError(f"{ckpt} is a folder (a sharded checkpoint of trainer.strategy.save_distributed_checkpoint="
                          "true?); export reads one full .ckpt file, what trainer=fsdp writes by default")
    if not ckpt.is_file():
        raise ExportError(f"{ckpt}: no such checkpoint file")
    check_destination(out, ckpt, force)
    has_lora = inspect_checkpoint(ckpt, trust)
    cfg, run_config = policy_config(ckpt, model_dir, has_lora)
    cfg.trust_checkpoint = trust
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lit-entropy-export-") as scratch:  # a lab policy's bare architecture
        try:
            bundle, what = build_policy(cfg, model_overridden=model_dir is not None or run_config is None,
                                        scratch=Path(scratch), trust_option=TRUST_FLAG)
        except OSError as err:
            raise ExportError(f"could not build the base model of {ckpt} ({err}); name its folder with "
                              "--model-dir") from err
        tokenizer = hf_tokenizer(bundle.tokenizer)
        model = merged_model(bundle).to(DTYPES[dtype])
        set_generation_ids(model, bundle.tokenizer)
        record = {
            "source_checkpoint": checkpoint_identity(ckpt),
            "run_config": str(run_config.resolve()) if run_config else None,
            "model_dir": str(model_dir) if model_dir is not None else None,
            "model_spec": model_spec(cfg),
            "policy": what,
            "lora_merged": has_lora,
            "dtype": str(DTYPES[dtype]).removeprefix("torch."),
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "package": "lit-entropy",
            "package_version": package_version(),
        }
        write_folder(out, model, tokenizer, record, force)
    log.info("exported %s into %s in %.1f s (%s)", ckpt, out, time.perf_counter() - t0, what)
    return out


def check_destination(out: Path, ckpt: Path, force: bool) -> None:
    """Refuse a non-empty ``out`` unless ``force``; with ``force``, refuse what replacing it would destroy."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder")
    if not (out.is_dir() and any(out.iterdir())):
        return
    if not force:
        raise ExportError(f"{out} is not empty; choose another folder, or pass --force to replace its content")
    if ckpt.resolve().is_relative_to(out.resolve()) or Path.cwd().resolve().is_relative_to(out.resolve()):
        raise ExportError(f"--force would delete {out}, which holds the checkpoint or the current folder")


def load_state(ckpt: Path, trust: bool = False) -> dict[str, Any]:
    """The checkpoint's ``state_dict``, loaded weights-only (``trust``: fully; :func:`load_checkpoint`) and
    memory-mapped where the file allows it (only the key names are read)."""
    try:
        blob = load_checkpoint(ckpt, trust=trust, trust_option=TRUST_FLAG)
    except UnsafeCheckpointError as err:
        raise ExportError(str(err)) from None
    except Exception as err:
        raise ExportError(f"{ckpt}: not a readable torch checkpoint ({type(err).__name__}: {err})") from err
    state = blob.get("state_dict", blob) if isinstance(blob, dict) else None
    if not isinstance(state, dict):
        raise ExportError(f"{ckpt}: no state_dict in the checkpoint (a training checkpoint of this package holds "
                          "one, with the policy under 'model.*')")
    return state


def inspect_checkpoint(ckpt: Path, trust: bool = False) -> bool:
    """Check the checkpoint holds a policy (``model.*`` keys) before anything is built; whether it has LoRA
    adapters (their scale ``alpha/r`` is in the run config, not in the tensors)."""
    keys = [k for k in load_state(ckpt, trust) if isinstance(k, str)]
    policy = [k for k in keys if k.startswith("model.")]
    if not policy:
        raise ExportError(f"{ckpt}: no 'model.*' keys in the state dict (found e.g. {keys[:3]}): not a policy "
                          "checkpoint written by lit-entropy's trainer")
    return any(".lora_" in k for k in policy)


def policy_config(ckpt: Path, model_dir: str | os.PathLike | None, has_lora: bool) -> tuple[DictConfig, Path | None]:
    """What :func:`build_policy` needs (``ckpt_path``, ``model``, ``paths.cache_dir``) and the run config used.

    The run's own ``.hydra/config.yaml`` when it is beside ``checkpoints/`` (``model_dir`` then replaces its
    base folder); otherwise ``model_dir`` as ``model=hf``'s folder, for a full fine-tune only (LoRA's alpha is
    not in the checkpoint).
    """
    run_config = find_run_config(ckpt)
    if run_config is not None:
        cfg = OmegaConf.load(run_config)
        if not isinstance(cfg, DictConfig) or "model" not in cfg:
            raise ExportError(f"{run_config} has no 'model' group; name the base folder with --model-dir")
        cfg.ckpt_path = str(ckpt)
        if model_dir is not None:
            target = str(cfg.model.get("_target_", ""))
            if target.endswith("TinyLabPolicy"):
                raise ExportError("--model-dir names the base folder of a model=hf or model=smollm2_135m run; a lab "
                                  f"run ({run_config}) rebuilds its architecture from its config: leave it out")
            cfg.model.name_or_path = str(model_dir)
            if "source" in cfg.model:  # SmolLMPolicy: the named folder, not the hub or the packaged GGUF
                cfg.model.source = "auto"
        return cfg, run_config
    where = f"{ckpt.resolve().parent.parent / '.hydra' / 'config.yaml'}"
    if model_dir is None:
        raise ExportError(f"{ckpt}: no run config at {where} (nor beside the checkpoint), so the base model is "
                          "unknown; keep the run's .hydra/ folder beside checkpoints/, or name the base model's "
                          "Hugging Face folder with --model-dir")
    if has_lora:
        raise ExportError(f"{ckpt} holds LoRA adapters, whose scale (model.lora.alpha / r) is in the run config, "
                          f"not in the checkpoint, and there is none at {where}: put the run's .hydra/ folder "
                          "back beside checkpoints/")
    cfg = OmegaConf.create({"ckpt_path": str(ckpt), "paths": {"cache_dir": ".cache/lit_entropy"},
                            "model": {"_target_": "lit_entropy.policy.models.HFPolicy", "name_or_path": str(model_dir)}})
    return cfg, None


def hf_tokenizer(tok: Any) -> Any:
    """The policy's tokenizer as a Hugging Face tokenizer with the same ids (what ``save_pretrained`` writes).

    The lab's character tokenizer becomes a ``PreTrainedTokenizerFast`` (:meth:`CharTokenizer.to_hf`); it is
    refused if that one would not give the very ids the policy was trained on.
    """
    if isinstance(tok, HFTokenizerAdapter):
        return tok.hf
    if isinstance(tok, CharTokenizer):
        hf = tok.to_hf()
        probe = tok.alphabet + "\n" + tok.alphabet[::-1]
        same = (len(hf) == tok.vocab_size and hf.encode(probe, add_special_tokens=False) == tok.encode(probe)
                and (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (tok.bos_id, tok.eos_id, tok.pad_id))
        if not same:
            raise ExportError(f"the lab's character tokenizer {tok!r} has no Hugging Face equivalent with the same "
                              f"ids, so a loader would read other tokens; {HF_POLICIES} runs export")
        return hf
    raise ExportError(f"the policy's tokenizer ({type(tok).__name__}) cannot be saved as a Hugging Face "
                      f"tokenizer; {HF_POLICIES} runs export")


@torch.no_grad()
def merged_model(bundle: PolicyBundle) -> torch.nn.Module:
    """The bundle's model with LoRA adapters merged into the base weights and removed (no ``lora_`` keys),
    tied embeddings still tied; a full fine-tune as it is."""
    model = bundle.model
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if is_peft(model):
        from peft.tuners.lora import LoraLayer

        head = model.get_base_model().get_output_embeddings()
        if tied and isinstance(head, LoraLayer):
            raise ExportError("LoRA adapts the output head, which is tied to the input embeddings: merged, the two "
                              "would differ and the folder could not keep them tied (leave lm_head out of "
                              "model.lora.target_modules)")
        model = model.merge_and_unload()
    left = [k for k in model.state_dict() if "lora_" in k]
    if left:
        raise ExportError(f"LoRA keys left after the merge: {left[:3]}")
    if tied:
        model.tie_weights()
        head, embed = model.get_output_embeddings(), model.get_input_embeddings()
        if head is not None and head.weight is not embed.weight:
            raise ExportError("the model's config ties lm_head to the input embeddings, but they came out untied")
    return model.eval()


def set_generation_ids(model: torch.nn.Module, tok: Any) -> None:
    """``generation_config``'s BOS/EOS/pad: the tokenizer's (its EOS ended every sample during training); a
    base model's other stop ids (a list of several EOS) are kept after it."""
    from transformers import GenerationConfig

    gen = getattr(model, "generation_config", None) or GenerationConfig.from_model_config(model.config)
    before = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
    eos = [int(tok.eos_id), *(int(i) for i in before if i is not None and int(i) != int(tok.eos_id))]
    gen.eos_token_id = eos[0] if len(eos) == 1 else eos
    gen.pad_token_id = int(tok.pad_id)
    gen.bos_token_id = None if tok.bos_id is None else int(tok.bos_id)
    gen._from_model_config = False  # set on purpose: transformers must not re-derive it from config.json
    model.generation_config = gen


def write_folder(out: Path, model: torch.nn.Module, tokenizer: Any, record: dict, force: bool) -> None:
    """Save everything into a temporary sibling of ``out``, then put it in ``out``'s place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if out.is_dir() and any(out.iterdir()):
            if not force:  # filled while the export ran
                raise ExportError(f"{out} is not empty; pass --force to replace its content")
            aside = out.with_name(f".{out.name}.replaced-{os.getpid()}")
            os.replace(out, aside)
            os.replace(tmp, out)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            if out.is_dir():
                out.rmdir()
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def checkpoint_identity(ckpt: Path) -> dict[str, Any]:
    """Path, size, mtime and (up to :data:`SHA256_MAX_BYTES`) sha256 of the source checkpoint."""
    stat = ckpt.stat()
    ident: dict[str, Any] = {"path": str(ckpt.resolve()), "size": stat.st_size,
                             "mtime": datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat(timespec="seconds"),
                             "sha256": None}
    if stat.st_size <= SHA256_MAX_BYTES:
        digest = hashlib.sha256()
        with open(ckpt, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
        ident["sha256"] = digest.hexdigest()
    return ident


def model_spec(cfg: DictConfig) -> Any:
    """The ``model`` group the policy was built from, resolved where its interpolations resolve here."""
    try:
        return OmegaConf.to_container(cfg.model, resolve=True)
    except Exception:  # e.g. ${hydra:...} outside a Hydra run
        return OmegaConf.to_container(cfg.model, resolve=False)


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lit-entropy")
    except PackageNotFoundError:
        return "unknown"
