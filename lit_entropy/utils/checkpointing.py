"""Checkpoint files: atomic writes, loads that cannot run code, and a start-up check of ``ckpt_path``.

A checkpoint is written to a temporary name in the same directory, fsynced, then renamed over the
target (``os.replace``), so a kill, Ctrl-C or full disk mid-write leaves the previous file intact.

Every checkpoint the package reads goes through :func:`load_checkpoint`: ``torch.load(weights_only=True)``, which
rebuilds tensors, containers and plain values and refuses any other object, so a file whose pickle would call a
function (a shell command, say) is refused naming the file and what it asked for, with nothing executed. What the
package's own checkpoints hold (callback and controller states, RNG states, the overlap queue) is saved in those
types. A sharded checkpoint folder's DCP ``.metadata`` pickle is checked by :func:`check_sharded_metadata` (only
DCP's own metadata classes and torch's dtypes and sizes may appear). Loading a file that needs full unpickling
(a checkpoint written by other code) takes an explicit ``trust_checkpoint=true`` (``--trust-checkpoint`` for the
export), and warns.

``check_resumable`` reads a checkpoint before any expensive work and refuses, naming the path, one
that is truncated or corrupt, unsafe, or written at an exception (not an iteration boundary).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import io
import logging
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

META_KEY = "lit_entropy"
"""Top-level checkpoint key: ``{"kind": "iteration" | "exception", "iteration": k, "reason": ..., "rng": ...}``."""


def temp_path(path: str | os.PathLike) -> Path:
    """The temporary name a checkpoint is written under before the rename (same directory, same disk)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp")


def _fsync(path: Path) -> None:
    """Flush a file, or every file of a directory and the directory itself, to the disk."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for f in files:
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if path.is_dir():
        fsync_dir(path)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename in ``path`` durable (POSIX: fsync the directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def atomic_write(path: str | os.PathLike, write: Callable[[str], None], publish: bool = True) -> None:
    """``write(tmp)`` then, where ``publish``, fsync ``tmp`` and rename it over ``path``.

    Every rank calls this (the write may be collective); only the rank that ``publish``-es renames.
    On any failure — ``OSError`` of a full disk, ``KeyboardInterrupt`` — the temporary file is removed
    and ``path`` keeps its previous content.
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        write(str(tmp))
        if publish:
            _fsync(tmp)
            if tmp.is_dir() and path.is_dir():  # a sharded (directory) checkpoint: rename() cannot replace it
                old = path.with_name(f".{path.name}.old")
                remove(old)
                os.replace(path, old)
                os.replace(tmp, path)
                remove(old)
            else:
                os.replace(tmp, path)
            fsync_dir(path.parent)
    except BaseException as err:
        if publish:
            remove(tmp)
        if isinstance(err, OSError):
            raise OSError(err.errno, f"could not write checkpoint {path} ({err}); "
                                     f"the previous {path.name}, if any, is intact") from err
        raise


def link_or_copy(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """``dst`` becomes a hard link to ``src`` (a copy where links are not possible), replaced atomically."""
    src, dst = Path(src), Path(dst)
    tmp = temp_path(dst)
    remove(tmp)
    try:
        if src.is_dir():
            shutil.copytree(src, tmp)
        else:
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        remove(tmp)
        raise


def to_host(obj: Any, _storages: dict | None = None) -> Any:
    """A copy of a checkpoint with every tensor in host memory, for a background write.

    The next update changes the live tensors in place, so the copy is taken at the boundary. Copying to host
    (not ``copy.deepcopy``, which would copy CUDA tensors to a second CUDA copy: the model and optimizer twice
    on the GPU) costs no accelerator memory. Tensors that share a storage (tied embeddings) still share one
    after the copy, so the file stays the size it would be. Containers keep their types; other leaves are
    deep-copied.
    """
    storages: dict = {} if _storages is None else _storages
    if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.layout == torch.strided:
        source = obj.untyped_storage()
        key = (obj.device, source.data_ptr())
        if key not in storages:
            storages[key] = source.cpu() if obj.device.type != "cpu" else source.clone()
        out = torch.empty(0, dtype=obj.dtype)
        return out.set_(storages[key], obj.storage_offset(), obj.size(), obj.stride())
    if isinstance(obj, dict):
        copied = type(obj)()
        for k, v in obj.items():
            copied[k] = to_host(v, storages)
        return copied
    if type(obj) in (list, tuple):
        return type(obj)(to_host(v, storages) for v in obj)
    return copy.deepcopy(obj)


def rng_to_safe(states: dict[str, Any]) -> dict[str, Any]:
    """Global RNG states in types ``torch.load(weights_only=True)`` accepts (Lightning loads that way):
    NumPy's key array becomes a tensor."""
    out = dict(states)
    if "numpy" in out:
        kind, keys, pos, has_gauss, gauss = out["numpy"]
        out["numpy"] = (kind, torch.from_numpy(keys.copy()), int(pos), int(has_gauss), float(gauss))
    return out


def rng_from_safe(states: dict[str, Any]) -> dict[str, Any]:
    out = dict(states)
    if "numpy" in out:
        kind, keys, pos, has_gauss, gauss = out["numpy"]
        out["numpy"] = (kind, keys.numpy(), pos, has_gauss, gauss)
    return out


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Leave the global RNGs (Python, NumPy, torch, CUDA) as they were: starting a rollout engine (vLLM
    seeds them all) must not move them, or a resumed run, which starts it later, would diverge."""
    from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states

    states = _collect_rng_states()
    try:
        yield
    finally:
        _set_rng_states(states)


TRUST_OPTION = "trust_checkpoint=true"
"""How a user asks for a full unpickling (training and evaluation; the export's flag is ``--trust-checkpoint``)."""


class UnsafeCheckpointError(ValueError):
    """A checkpoint whose loading would construct objects other than tensors, containers and plain values."""


def _unsafe(path: Path, detail: str, trust_option: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"{path}: refused, loading it would run code or build objects a weights-only load does not allow "
        f"({detail}). Nothing in it was executed. Checkpoints written by lit-entropy never need this. If you "
        f"wrote this file yourself or trust whoever did, load it fully with {trust_option}")


def _refused_global(err: BaseException) -> str:
    """What torch's weights-only unpickler refused, from its message (``Unsupported global: GLOBAL posix.system``)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for line in lines:
        if "Unsupported global" in line or "Unsupported operand" in line or "Trying to" in line:
            return line.rstrip(".").split(". ")[0]
    return lines[-1][:200] if lines else type(err).__name__


def load_checkpoint(path: str | os.PathLike, *, trust: bool = False, mmap: bool = True,
                    trust_option: str = TRUST_OPTION) -> Any:
    """A checkpoint file's content on the CPU, loaded weights-only (see the module's docstring).

    ``trust``: a full unpickling instead, with a warning: only for a file the user vouches for. ``mmap``: map the
    tensors instead of reading them (a legacy, non-zip file cannot be; it is read). A file the weights-only
    loader refuses raises :class:`UnsafeCheckpointError`, naming the file, what it asked for and ``trust_option``;
    any other failure (a truncated or corrupt file, bytes that are no pickle) is torch's own exception.
    """
    path = Path(path)
    if trust:
        log.warning("%s: loading with full unpickling (%s): this runs whatever code the file holds; do this only "
                    "for a file you trust", path, trust_option)
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as err:
            if not mmap or "mmap" not in str(err):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # a legacy (non-zip) file
    except pickle.UnpicklingError as err:
        if any(s in str(err) for s in ("Unsupported operand", "EOF", "truncated")):
            raise  # not a pickle at all (a damaged or foreign file): the caller's "not readable"
        raise _unsafe(path, _refused_global(err), trust_option) from None


# What a DCP ``.metadata`` pickle may construct: DCP's metadata classes (dataclasses and enums of
# torch.distributed.checkpoint), torch's sizes, dtypes, layouts and memory formats, and a path.
_DCP_EXTRA = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
              ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
              ("pathlib", "PureWindowsPath"), ("pathlib", "Path")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import importlib

        allowed = (module, name) in _DCP_EXTRA
        dcp = module == "torch.distributed.checkpoint" or module.startswith("torch.distributed.checkpoint.")
        if not allowed and (module == "torch" or dcp):
            try:
                obj = getattr(importlib.import_module(module), name, None)
            except ImportError:
                obj = None
            allowed = (isinstance(obj, torch.dtype | torch.layout | torch.memory_format)
                       or (isinstance(obj, type) and dcp
                           and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))))
        if not allowed:
            raise pickle.UnpicklingError(f"Unsupported global: {module}.{name}")
        return super().find_class(module, name)


def check_sharded_metadata(path: str | os.PathLike, trust_option: str = TRUST_OPTION) -> None:
    """Refuse a sharded (DCP) checkpoint folder whose ``.metadata`` pickle asks for anything but DCP's metadata
    (torch reads that file with a plain ``pickle.load``)."""
    metadata = Path(path) / ".metadata"
    try:
        _MetadataUnpickler(io.BytesIO(metadata.read_bytes())).load()
    except pickle.UnpicklingError as err:
        raise _unsafe(metadata, str(err).splitlines()[0], trust_option) from None


def _corrupt(path: Path, why: str) -> ValueError:
    return ValueError(
        f"ckpt_path={path}: not a readable checkpoint ({why}); it was probably truncated by a crash or a full "
        f"disk. Resume from another one, e.g. an earlier {path.parent}/iteration-*.ckpt (callbacks.checkpoint.keep_iterations)"
    )


def check_resumable(path: str | os.PathLike, trust: bool = False) -> dict[str, Any]:
    """Refuse a checkpoint a run cannot resume from, naming it; return its metadata.

    Returns ``{"step": optimizer steps logged so far (TensorBoard's step), "iteration": k, "kind": ...}``.
    A directory (sharded FSDP2 checkpoint) is checked for its ``.metadata`` file, which must hold DCP's metadata
    only. ``trust``: load a file that needs full unpickling (:func:`load_checkpoint`).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"ckpt_path={path}: no such file")
    if path.is_dir():
        if not (path / ".metadata").exists():
            raise _corrupt(path, "a directory without .metadata")
        if not trust:
            check_sharded_metadata(path)
        return {"step": None, "iteration": None, "kind": None}
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()  # reads every member and checks its CRC: truncation and bit rot
        if bad is not None:
            raise _corrupt(path, f"member {bad} fails its CRC check")
        ckpt = load_checkpoint(path, trust=trust)
    except ValueError:  # UnsafeCheckpointError included
        raise
    except Exception as err:  # BadZipFile, RuntimeError of torch's reader, UnpicklingError, EOFError, ...
        raise _corrupt(path, f"{type(err).__name__}: {str(err)[:200]}") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "loops" not in ckpt:
        raise ValueError(f"ckpt_path={path}: not a training checkpoint of this package (no state_dict/loops)")
    meta = ckpt.get(META_KEY) or {}
    if meta.get("kind") == "exception":
        raise ValueError(
            f"ckpt_path={path} was written when the run failed mid-iteration {meta.get('iteration')} "
            f"({meta.get('reason')}); it holds that state for inspection, but resuming it would apply part of an "
            f"iteration twice. Resume exactly from {path.parent / 'last.ckpt'} (the last iteration boundary)"
        )
    fit = ckpt["loops"].get("fit_loop", {})
    epochs = fit.get("epoch_progress", {}).get("total", {})
    counts = {epochs.get(k) for k in ("ready", "started", "processed", "completed")}
    if len(counts) > 1:
        log.warning("ckpt_path=%s was written inside an iteration (epoch progress %s), not at an iteration "
                    "boundary: the resumed run will not continue exactly", path, epochs)
    step = fit.get("epoch_loop.state_dict", {}).get("_batches_that_stepped")
    return {"step": step, "iteration": epochs.get("completed"), "kind": meta.get("kind")}
