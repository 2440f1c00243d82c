"""A Ctrl-C that cannot be lost.

Python turns SIGINT into a ``KeyboardInterrupt`` raised wherever the main thread happens to be. When that
is inside library code that catches ``BaseException`` and carries on, the interrupt is gone and the run
goes on to its end. :class:`InterruptLatch` installs a SIGINT handler that remembers the signal before
raising, and raises ``KeyboardInterrupt`` again at the next training-batch or iteration boundary if the
first one never reached Lightning. Lightning then shuts down as for any Ctrl-C: ``on_exception``
callbacks run (``exception.ckpt``), and the process exits with status 1.

A process that *starts* with SIGINT ignored (a background job of a non-interactive shell, or a child of
a process that ignores it) keeps ignoring it, by POSIX convention; the latch leaves that alone, as it
leaves any handler of the user's own. Stop such a run with SIGTERM: it is checkpointed too.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import lightning.pytorch as pl


class InterruptLatch(pl.Callback):
    """Remember SIGINT during ``fit``; raise ``KeyboardInterrupt`` at the next boundary if it was swallowed."""

    def __init__(self) -> None:
        self.pending = False
        self._previous: Any = None
        self._installed = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The SIGINT handler: latch, then raise as Python's default handler does."""
        self.pending = True
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a SIGINT came and was not acted on."""
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt("SIGINT received earlier; its first KeyboardInterrupt was swallowed")

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Only the main thread may set handlers; only the default handler is replaced (a user's own stays).
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self.handle)
            self._installed = True

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # Lightning sets SIG_IGN while it shuts down after a Ctrl-C: leave that; restore only our own.
        if self._installed and signal.getsignal(signal.SIGINT) == self.handle:
            signal.signal(signal.SIGINT, self._previous)
        self._installed = False

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self.check()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.check()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check()
