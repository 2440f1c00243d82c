"""InterruptLatch: a SIGINT whose KeyboardInterrupt a library swallows still stops the run."""

from __future__ import annotations

import os
import signal

import lightning.pytorch as pl
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

from lit_entropy.callbacks.interrupt import InterruptLatch


class SwallowsCtrlC(BoringModel):
    """At batch 1, SIGINT arrives inside code that catches BaseException and goes on."""

    def __init__(self) -> None:
        super().__init__()
        self.batches_run = 0

    def training_step(self, batch, batch_idx):
        self.batches_run += 1
        if batch_idx == 1:
            try:
                os.kill(os.getpid(), signal.SIGINT)
            except BaseException:  # noqa: B036 - the library that swallows it
                pass
        return super().training_step(batch, batch_idx)


class SeesException(pl.Callback):
    def __init__(self) -> None:
        self.seen: BaseException | None = None

    def on_exception(self, trainer, pl_module, exception):
        self.seen = exception


@pytest.fixture(autouse=True)
def default_sigint():
    """Python's own SIGINT handler for each test, whatever an earlier test left (the latch replaces only it)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def fit(callbacks: list[pl.Callback]) -> tuple[SwallowsCtrlC, BaseException | None]:
    model = SwallowsCtrlC()
    trainer = pl.Trainer(max_epochs=2, limit_train_batches=6, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=callbacks)
    before = signal.getsignal(signal.SIGINT)
    error: BaseException | None = None
    try:
        trainer.fit(model)
    except SystemExit as err:  # Lightning's graceful Ctrl-C ends in sys.exit(1)
        error = err
    finally:
        signal.signal(signal.SIGINT, before)  # Lightning leaves SIGINT ignored after a Ctrl-C
    return model, error


def test_a_swallowed_ctrl_c_is_raised_again_at_the_next_batch():
    seen = SeesException()
    model, error = fit([InterruptLatch(), seen])
    assert isinstance(error, SystemExit) and error.code == 1
    assert isinstance(seen.seen, KeyboardInterrupt)  # on_exception ran: exception.ckpt would be written
    assert model.batches_run == 2  # stopped at the boundary right after batch 1, not at the end (12)


def test_without_the_latch_the_swallowed_ctrl_c_is_lost():
    """The failure the latch exists for: the run ignores the interrupt and goes to its end."""
    model, error = fit([])
    assert error is None and model.batches_run == 12


def test_the_handler_is_restored_after_fit_and_a_users_own_handler_is_kept():
    seen = []
    mine = lambda signum, frame: seen.append(signum)  # noqa: E731
    before = signal.signal(signal.SIGINT, mine)
    try:
        latch = InterruptLatch()
        trainer = pl.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[latch])
        trainer.fit(BoringModel())
        assert signal.getsignal(signal.SIGINT) is mine and not latch._installed
    finally:
        signal.signal(signal.SIGINT, before)
    latch = InterruptLatch()
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[latch])
    trainer.fit(BoringModel())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_check_raises_once():
    latch = InterruptLatch()
    latch.check()  # nothing pending
    with pytest.raises(KeyboardInterrupt):
        latch.handle(signal.SIGINT, None)
    assert latch.pending
    with pytest.raises(KeyboardInterrupt, match="swallowed"):
        latch.check()
    latch.check()
