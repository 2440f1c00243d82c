"""One in-process harness for real training runs: the real Hydra composition, the real Lightning Trainer,
one shared vLLM engine, and the run's own TensorBoard event files read back.

``Harness.fit(overrides, tmp_path)`` calls what ``scripts/train.py`` calls (:func:`lit_entropy.train.fit`, the
body of ``lit_entropy.train.run``: the ``ckpt_path`` check, ``build``, ``trainer.fit``, ``datamodule.close()``, the
finite-metrics check) without a new interpreter: no import of torch, Lightning and vLLM and no vLLM start per run. What a process would
start fresh and a second fit in the same process would inherit is put back after every fit (torch's thread
count, warnings filters, logger levels, environment variables, SIGINT); what it cannot put back is made not
to matter: ``build`` seeds every RNG, the engine samples with per-request seeds, and every fit loads its own
policy's weights into the engine before its first generation. ``tests/integration/test_harness.py`` checks
that two consecutive fits on one engine log exactly the scalars of two fresh ``scripts/train.py`` processes.
"""

from __future__ import annotations

import logging
import os
import signal
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tests.helpers import ROOT, compose_train, read_scalars

VLLM_TARGET = "lit_entropy.rollout.vllm_engine.VLLMEngine"
SMOKE = ["debug=smoke"]


@dataclass
class RunResult:
    """What a test reads from a run: its folder, TensorBoard scalars, checkpoints and the fitted objects."""

    run_dir: Path
    scalars: dict[str, list[tuple[int, float]]]
    metrics: dict[str, float]
    module: Any = field(repr=False)
    trainer: Any = field(repr=False)
    cfg: Any = field(repr=False)
    warnings: list[str] = field(default_factory=list)
    """Every warning the fit raised (what a process would print on stderr), as text."""

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def last_ckpt(self) -> Path:
        return self.checkpoints / "last.ckpt"

    def ckpt(self, iteration: int) -> Path:
        """The checkpoint after ``iteration`` iterations (``callbacks.checkpoint.keep_iterations=true``)."""
        return self.checkpoints / f"iteration-{iteration:04d}.ckpt"

    def values(self, tag: str) -> list[float]:
        return [v for _, v in sorted(self.scalars[tag])]

    def callback(self, name: str) -> Any:
        """The trainer's callback whose class name is ``name``."""
        found = [cb for cb in self.trainer.callbacks if type(cb).__name__ == name]
        assert found, [type(cb).__name__ for cb in self.trainer.callbacks]
        return found[0]


class _Borrowed:
    """A shared engine lent to one fit: everything goes to the engine, except ``close`` (the fit's sampler
    closes the engine it was given by a factory; the harness closes the shared one at the end)."""

    def __init__(self, engine: Any) -> None:
        object.__setattr__(self, "_engine", engine)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._engine, name, value)

    def close(self) -> None:
        pass


class Harness:
    """Session-wide: the lab policy's warm start (shipped in the package) and the vLLM
    engines shared by every fit (one per distinct engine setting; the lab's runs use one or two)."""

    def __init__(self) -> None:
        self.engines: dict[tuple, Any] = {}
        self.starts = 0  # vLLM engines started (tests check that fits share them)

    # ---- the lab policy ---------------------------------------------------------------------------
    def warm_start(self, overrides: list[str] = ()) -> str:
        """Find (or, for settings other than the shipped default's, build and cache) the lab policy's warm start;
        its path."""
        from hydra.utils import instantiate

        cfg = compose_train([*SMOKE, *overrides, f"paths.root_dir={ROOT}", "paths.output_dir=unused"])
        return instantiate(cfg.model).build().path

    # ---- the shared engine ------------------------------------------------------------------------
    def engine_factory(self, node: Any) -> Any:
        """A factory taking what ``Sampler.start`` passes to ``rollout.engine``, returning the shared engine
        started with those values (the same keyword arguments a fresh process would start it with)."""
        from hydra.utils import instantiate
        from omegaconf import OmegaConf

        partial = instantiate(node)
        validate = getattr(partial.func, "validate", None)
        if callable(validate):
            validate(**partial.keywords)
        fixed = OmegaConf.to_container(node, resolve=True)

        def make(model_path: str, eos_id: int, pad_id: int | None = None, max_model_len: int | None = None,
                 world_size: int = 1, generation_batch: int | None = None) -> _Borrowed:
            kwargs = dict(model_path=model_path, eos_id=eos_id, pad_id=pad_id, max_model_len=max_model_len,
                          world_size=world_size, generation_batch=generation_batch)
            key = (repr(sorted(fixed.items())), repr(sorted(kwargs.items())))
            if self.engines and not _parallel_groups_alive():
                # An engine some test built and closed by hand tore down vLLM's process-wide parallel groups,
                # which the shared engines use: they can no longer generate. Drop them; start afresh.
                self.close()
            if key not in self.engines:
                self.engines[key] = partial(**kwargs)
                self.starts += 1
            return _Borrowed(self.engines[key])

        return make

    def _drop_dirty(self, everything: bool) -> None:
        """Close the shared engines when one of them must not be inherited by a later fit (see :meth:`fit`):
        all of them, since closing one tears down vLLM's parallel groups the others use."""
        dirty = [e for e in self.engines.values()
                 if getattr(e, "llm", None) is None or e.llm.llm_engine.has_unfinished_requests()]
        if everything or dirty:
            self.close()

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()

    # ---- one run ----------------------------------------------------------------------------------
    def compose(self, overrides: list[str], run_dir: Path, smoke: bool = True) -> Any:
        return compose_train([*(SMOKE if smoke else []), *overrides, f"paths.root_dir={ROOT}",
                              f"paths.log_dir={run_dir.parent}", f"paths.output_dir={run_dir}"])

    def fit(self, overrides: list[str], tmp_path: Path, *, smoke: bool = True, name: str = "run",
            fresh_engine: bool = False) -> RunResult:
        """Fit the run ``overrides`` compose (after ``debug=smoke`` unless ``smoke=False``) in
        ``tmp_path / name`` as ``scripts/train.py`` would; raises what the run raises.

        ``fresh_engine``: the fit starts (and closes) an engine of its own, as a process would, instead of
        borrowing the shared one: for runs compared bit for bit with real processes. An overlapped run
        (``rollout.max_staleness`` > 0, a background thread generating) never borrows the shared engine, and
        a shared engine left with unfinished requests, or lent to a fit that raised, is closed and dropped,
        so no later fit inherits its scheduler state.
        """
        from lit_entropy.train import fit

        run_dir = Path(tmp_path) / name
        cfg = self.compose(list(overrides), run_dir, smoke)
        share = (cfg.rollout.engine._target_ == VLLM_TARGET and not fresh_engine
                 and not cfg.rollout.get("max_staleness", 0))
        if cfg.rollout.engine._target_ == VLLM_TARGET and not share:
            # Closing an in-process vLLM engine tears down vLLM's global parallel groups, which every other
            # engine of the process uses: the private engine's close would break the shared ones.
            self.close()
        engine = self.engine_factory(cfg.rollout.engine) if share else None
        clean = False
        try:
            with process_state() as caught:
                fitted = fit(cfg, engine=engine)  # lit_entropy.train.run's body, with the shared engine
            clean = True
        finally:
            if share:
                self._drop_dirty(everything=not clean)
        trainer, module, metrics = fitted.trainer, fitted.module, fitted.metrics
        return RunResult(run_dir=run_dir, scalars=read_scalars(run_dir), metrics=metrics, module=module,
                         trainer=trainer, cfg=cfg, warnings=[str(w.message) for w in caught])


def _parallel_groups_alive() -> bool:
    """Whether vLLM's process-wide tensor and pipeline parallel groups exist (closing any in-process engine
    destroys them for every engine of the process)."""
    from vllm.distributed import parallel_state

    return parallel_state.model_parallel_is_initialized()


class process_state:
    """Put back what a fit changes in the process and a fresh process would not carry into the next run."""

    LOGGERS = ("vllm", "lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero", "lightning.fabric",
               "transformers", "torch", "lit_entropy")

    def __enter__(self) -> list[warnings.WarningMessage]:
        self.threads = torch.get_num_threads()
        self.env = dict(os.environ)
        self.sigint = signal.getsignal(signal.SIGINT)
        self.warnings = warnings.catch_warnings(record=True)
        caught = self.warnings.__enter__()
        self.levels = {name: logging.getLogger(name).level for name in self.LOGGERS}
        self.grad = torch.is_grad_enabled()
        return caught

    def __exit__(self, *exc: Any) -> None:
        torch.set_num_threads(self.threads)
        torch.set_grad_enabled(self.grad)
        for key in set(os.environ) - set(self.env):
            del os.environ[key]
        os.environ.update(self.env)
        if signal.getsignal(signal.SIGINT) is not self.sigint:
            signal.signal(signal.SIGINT, self.sigint)
        self.warnings.__exit__(*exc)
        for name, level in self.levels.items():
            logging.getLogger(name).setLevel(level)
