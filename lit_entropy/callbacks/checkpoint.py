"""IterationCheckpoint: a consistent, atomically written checkpoint at every RL iteration boundary.

Why not Lightning's ``ModelCheckpoint`` as it is: it saves inside ``on_train_epoch_end``, before the
fit loop has counted the epoch as completed and before the epoch's metrics reach the logger. Resuming
such a checkpoint re-runs the finished iteration's rollout (``train_dataloader()`` is called for the
restored ``current_epoch``), so every controller steps one extra time; and with ``save_top_k: 0`` it
writes ``last.ckpt`` only when training ends.

This callback saves at the one point where an iteration is wholly done and the next has not begun:
the start of each epoch's iteration (:func:`lit_entropy.iteration.run` calls ``on_rollout_start``, step 0),
after the previous epoch is counted and its metrics are logged and flushed, before the next sync,
rollout and controller step. Resuming it runs exactly the iterations that were not done. It saves:

* ``last.ckpt`` at every ``every_n_epochs``-th boundary (boundary 0, before the first rollout, too, so a
  crash at any time leaves a checkpoint) and when training ends; with ``keep_iterations`` also
  ``iteration-NNNN.ckpt`` (a hard link, no extra disk) holding the state after NNNN iterations;
* ``exception.ckpt`` when ``fit`` dies with an exception (``FloatingPointError``, ``KeyboardInterrupt`` of
  Ctrl-C, …): the state at that moment, for inspection; ``ckpt_path`` refuses it (it is mid-iteration) —
  ``last.ckpt`` is the one to resume from.

Every file is written under a temporary name, fsynced and renamed (:func:`lit_entropy.utils.checkpointing.atomic_write`).
The global RNG states (Python, NumPy, torch) go into the checkpoint and are restored at the boundary.

With ``async_write`` (one process only) the boundary's state is copied at the boundary and written by a
background thread while the next iteration runs; the next save, the end of training and a failure wait
for it. A process killed mid-write leaves the previous ``last.ckpt``, one iteration older.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.utilities.seed import _collect_rng_states, _set_rng_states
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_entropy.utils.checkpointing import (
    META_KEY,
    atomic_write,
    link_or_copy,
    remove,
    rng_from_safe,
    rng_to_safe,
    temp_path,
    to_host,
)

log = logging.getLogger(__name__)


class IterationCheckpoint(ModelCheckpoint):
    """``last.ckpt`` at iteration boundaries (atomic), ``exception.ckpt`` when ``fit`` fails."""

    LAST = "last.ckpt"
    EXCEPTION = "exception.ckpt"

    def __init__(self, dirpath: str, every_n_epochs: int = 1, keep_iterations: bool = False,
                 save_on_exception: bool = True, async_write: bool = True) -> None:
        """``every_n_epochs``: iterations between boundary checkpoints (a crash recomputes fewer than that).
        ``keep_iterations``: also keep ``iteration-NNNN.ckpt`` for every boundary saved.
        ``async_write``: write boundary checkpoints in a background thread (one process only)."""
        if not isinstance(every_n_epochs, int) or every_n_epochs < 1:
            raise ValueError(f"callbacks.checkpoint.every_n_epochs={every_n_epochs!r} must be an integer >= 1")
        super().__init__(dirpath=dirpath, save_last=True, save_top_k=0, every_n_epochs=every_n_epochs,
                         enable_version_counter=False)
        self.keep_iterations = keep_iterations
        self.exception_checkpoint = save_on_exception
        self._saved_boundary: int | None = None  # iteration count of the last boundary written
        self._pending_rng: dict[str, Any] | None = None
        self._meta: dict[str, Any] = {}
        self.async_write = async_write
        self._writer: threading.Thread | None = None
        self._writer_error: BaseException | None = None

    # ---- Lightning's save points are not iteration boundaries: none of them saves -----------------
    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        return

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        return

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        return

    # ---- boundaries ------------------------------------------------------------------------------
    def on_rollout_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Called by the rollout DataModule before iteration ``trainer.current_epoch`` syncs and generates."""
        if self._pending_rng is not None:  # resumed: the global RNGs continue from the saved boundary
            _set_rng_states(self._pending_rng)
            self._pending_rng = None
        if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
            return
        done = trainer.current_epoch
        if done == 0 and _sharded_without_optimizer_state(trainer):
            # FSDP2's full optimizer state dict "initialises" an empty optimizer with a zero-gradient step,
            # which advances Adam's step count: saving before the first update would change the run.
            return
        if done % self._every_n_epochs == 0 and done != self._saved_boundary:
            self.save_boundary(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch != self._saved_boundary:
            self.save_boundary(trainer)
        self.wait()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        try:
            self.wait()
        except BaseException as err:  # noqa: B036 - reported; a teardown must not mask the run's own outcome
            log.error("%s", err)

    def save_boundary(self, trainer: pl.Trainer) -> None:
        """``last.ckpt`` (and ``iteration-NNNN.ckpt``) holding the state after ``current_epoch`` iterations."""
        done = trainer.current_epoch
        self._flush_loggers(trainer)  # nothing logged before the boundary may be lost with the process
        last = Path(self.dirpath) / self.LAST
        self._meta = {"kind": "iteration", "iteration": done}
        self.last_model_path = str(last)
        keep = Path(self.dirpath) / f"iteration-{done:04d}.ckpt" if self.keep_iterations else None
        self.wait()
        if self.async_write and trainer.world_size == 1:
            self._write_in_background(trainer, last, keep)
        else:
            self._write(trainer, last)
            if keep is not None and trainer.is_global_zero:
                link_or_copy(last, keep)
        trainer.strategy.barrier("IterationCheckpoint")
        self._saved_boundary = done

    def wait(self) -> None:
        """Wait for a background write; raise its error, if any."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        err, self._writer_error = self._writer_error, None
        if err is not None:
            raise err

    def _write_in_background(self, trainer: pl.Trainer, path: Path, keep: Path | None) -> None:
        """Copy the state to host memory now (the next update changes the tensors in place), write it in a thread."""
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint = to_host(trainer._checkpoint_connector.dump_checkpoint(self.save_weights_only))
        io = trainer.strategy.checkpoint_io

        def write() -> None:
            try:
                atomic_write(path, lambda tmp: io.save_checkpoint(checkpoint, tmp))
                if keep is not None:
                    link_or_copy(path, keep)
            except BaseException as err:  # noqa: B036 - handed to the main thread by wait()
                self._writer_error = err

        self._writer = threading.Thread(target=write, name="IterationCheckpoint", daemon=True)
        self._writer.start()
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = str(path)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """``exception.ckpt``: the state when ``fit`` failed (never raises; the original error matters)."""
        if self.dirpath is None:
            return
        try:
            self.wait()  # the last boundary's background write completes first
        except BaseException as err:  # noqa: B036
            log.error("%s", err)
        progress = trainer.fit_loop.epoch_progress.current
        if isinstance(exception, SIGTERMException) and progress.ready == progress.completed:
            try:  # Lightning stops on SIGTERM after an epoch: that is a boundary
                self.save_boundary(trainer)
                self.wait()
            except BaseException as err:  # noqa: B036
                log.error("could not write %s after SIGTERM: %s", self.LAST, err)
            return
        if not self.exception_checkpoint:
            return
        if trainer.world_size > 1:  # a collective save cannot be trusted when only some ranks failed
            log.warning("no %s on %d ranks; resume from %s", self.EXCEPTION, trainer.world_size, self.LAST)
            return
        path = Path(self.dirpath) / self.EXCEPTION
        reason = f"{type(exception).__name__}: {str(exception)[:300]}"
        try:
            self._flush_loggers(trainer)
            self._meta = {"kind": "exception", "iteration": trainer.current_epoch, "reason": reason}
            self._write(trainer, path)
        except BaseException as err:  # noqa: B036 - a second Ctrl-C or a full disk must not mask the cause
            log.error("could not write %s after %s: %s", path, reason, err)
            return
        last = Path(self.dirpath) / self.LAST
        log.warning("%s in iteration %d: wrote %s (that state, for inspection); resume exactly with ckpt_path=%s "
                    "(after %s iterations)", reason, trainer.current_epoch, path, last, self._saved_boundary)

    # ---- writing ---------------------------------------------------------------------------------
    def _write(self, trainer: pl.Trainer, path: Path) -> None:
        if trainer.is_global_zero:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: trainer.save_checkpoint(tmp, self.save_weights_only),
                     publish=trainer.is_global_zero)
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = str(path)

    @staticmethod
    def _flush_loggers(trainer: pl.Trainer) -> None:
        for logger in trainer.loggers:
            logger.save()
            flush = getattr(getattr(logger, "experiment", None), "flush", None)
            if callable(flush):
                flush()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and self.dirpath is not None:  # leftovers of a process killed mid-write
            for name in (self.LAST, self.EXCEPTION):
                remove(temp_path(Path(self.dirpath) / name))

    # ---- checkpoint content ----------------------------------------------------------------------
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint[META_KEY] = {**self._meta, "rng": rng_to_safe(_collect_rng_states())}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        meta = checkpoint.get(META_KEY) or {}
        self._pending_rng = rng_from_safe(meta["rng"]) if meta.get("rng") else None

    def state_dict(self) -> dict[str, Any]:
        return {"dirpath": self.dirpath, "last_model_path": self.last_model_path}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return  # where the old run wrote is not this run's business; the loops hold the progress


def _sharded_without_optimizer_state(trainer: pl.Trainer) -> bool:
    """FSDP2-sharded parameters and an optimizer that has not stepped yet."""
    module = trainer.lightning_module
    sharded = any(type(p).__name__ == "DTensor" for p in module.parameters())
    return sharded and not any(opt.state for opt in trainer.optimizers)
