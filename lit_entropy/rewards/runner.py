"""Isolated reward execution: a crashing, hanging or NaN-returning reward scores 0 and is counted.

A reward is a picklable top-level function ``fn(prompt, completion, reference, **fn_kwargs) -> float``.

Process mode (default) runs calls in a ``ProcessPoolExecutor`` with the *spawn* context (the trainer
process runs vLLM and CUDA threads, so forking it is unsafe). One submitted task is one call. Waiting
works by progress: while calls keep finishing, everyone waits; when no call has finished for
``timeout_s`` the calls occupying the workers are hung. Those score 0 as timeouts, the worker
processes are killed, and the calls that had not started are re-run on a fresh pool. A batch therefore
pays about ``timeout_s`` per round of hung calls (``num_workers`` hang in parallel), not per call.

A worker that dies (``os._exit``, segfault, OOM kill) breaks the whole pool and every unfinished call
with it. The broken calls are then re-run one at a time on a fresh pool, so only the calls that break
it again are scored 0 as errors; the others get their real reward.

Spawned workers re-import the parent's ``__main__`` and the reward's module, which can take longer
than ``timeout_s``; a new pool is therefore warmed up (every worker started, reward module imported)
before any call is timed, within ``startup_timeout_s``. A pool that cannot start raises RuntimeError:
that is a configuration error, not a misbehaving reward.

Inline mode calls the reward in this process and catches its exceptions; it cannot stop a hung call.
"""

from __future__ import annotations

import math
import multiprocessing
import numbers
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

_OK, _ERROR, _NON_FINITE, _TIMEOUT = "ok", "error", "non_finite", "timeout"
_Result = tuple[str, float]
MODES = ("inline", "process")


@dataclass
class RewardStats:
    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    non_finite: int = 0

    def __add__(self, other: RewardStats) -> RewardStats:
        return RewardStats(
            self.calls + other.calls,
            self.errors + other.errors,
            self.timeouts + other.timeouts,
            self.non_finite + other.non_finite,
        )

    @property
    def failures(self) -> int:
        """Calls that scored 0 because the reward misbehaved."""
        return self.errors + self.timeouts + self.non_finite


def _normalize(value: Any) -> _Result:
    """Map a reward's return value to (status, reward); only real numbers are accepted."""
    if isinstance(value, (str, bytes)) or not (isinstance(value, numbers.Real) or hasattr(value, "__float__")):
        return _ERROR, 0.0
    try:
        result = float(value)
    except Exception:
        return _ERROR, 0.0
    return (_OK, result) if math.isfinite(result) else (_NON_FINITE, 0.0)


def _invoke(fn: Callable, kwargs: dict, prompt: str, completion: str, reference: Any) -> _Result:
    """One reward call; runs in a worker (or inline) and never raises."""
    try:
        return _normalize(fn(prompt, completion, reference, **kwargs))
    except (Exception, SystemExit):
        return _ERROR, 0.0


def _init_worker(fn: Callable, ready: Any) -> None:
    """Worker start-up. Receiving `fn` here imports its module before any call is timed."""
    del fn
    # Ctrl-C goes to the whole process group; let the parent handle it, not every worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    ready.put(os.getpid())


def _exit_when_orphaned(parent: int, every_s: float = 0.5) -> None:
    """Worker watchdog: when the trainer dies (even by SIGKILL) the worker is re-parented; exit then,
    whatever the worker's main thread is doing (a hung reward included)."""
    while True:
        time.sleep(every_s)
        if os.getppid() != parent:
            os._exit(0)


def _noop() -> None:
    return None


class RewardRunner:
    """Scores batches with `fn`, isolating failures. See the module docstring for the semantics.

    `total` accumulates `RewardStats` over every `score` call.
    """

    def __init__(
        self,
        fn: Callable[..., float],
        *,
        timeout_s: float = 5.0,
        mode: str = "process",
        num_workers: int = 2,
        fn_kwargs: dict | None = None,
        startup_timeout_s: float = 300.0,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {fn!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
            math.isfinite(timeout_s) and timeout_s > 0
        ):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        if not (isinstance(startup_timeout_s, (int, float)) and startup_timeout_s > 0):
            raise ValueError(f"startup_timeout_s must be a number > 0, got {startup_timeout_s!r}")
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        self.fn = fn
        self.fn_kwargs = dict(fn_kwargs or {})
        self.timeout_s = float(timeout_s)
        self.mode = mode
        self.num_workers = num_workers
        self.startup_timeout_s = float(startup_timeout_s)
        self.total = RewardStats()
        self._pool: ProcessPoolExecutor | None = None
        if mode == "process":
            try:
                pickle.dumps((fn, self.fn_kwargs))
            except Exception as err:
                raise ValueError(
                    f"mode='process' needs a picklable top-level fn and fn_kwargs ({err}); "
                    "define the reward at module level or use mode='inline'"
                ) from err

    # ------------------------------------------------------------------ public API

    def score(
        self, prompts: list[str], completions: list[str], references: list | None = None
    ) -> tuple[list[float], RewardStats]:
        """Rewards for each (prompt, completion, reference) and the `RewardStats` of this call."""
        if len(completions) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if references is None:
            references = [None] * len(prompts)
        elif len(references) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(references)} references")
        calls = list(zip(prompts, completions, references, strict=True))
        if self.mode == "inline":
            results = [_invoke(self.fn, self.fn_kwargs, *call) for call in calls]
        else:
            results = self._score_in_processes(calls)
        statuses = [status for status, _ in results]
        stats = RewardStats(
            calls=len(calls),
            errors=statuses.count(_ERROR),
            timeouts=statuses.count(_TIMEOUT),
            non_finite=statuses.count(_NON_FINITE),
        )
        self.total = self.total + stats
        return [reward for _, reward in results], stats

    def close(self) -> None:
        """Shut the worker pool down (a later `score` starts a new one)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            pool, self._pool = self._pool, None
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        except Exception:
            pass

    # ------------------------------------------------------------------ process mode

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            ready = ctx.Queue()
            self._pool = ProcessPoolExecutor(
                max_workers=self.num_workers, mp_context=ctx, initializer=_init_worker, initargs=(self.fn, ready)
            )
            # With spawn, the executor starts one worker per submit while none is idle: this starts all.
            probes = [self._pool.submit(_noop) for _ in range(self.num_workers)]
            deadline = time.monotonic() + self.startup_timeout_s
            started = 0
            while started < self.num_workers:
                try:
                    ready.get(timeout=0.05)
                    started += 1
                    continue
                except queue.Empty:
                    pass
                failed = any(p.done() and p.exception() is not None for p in probes)
                if failed or time.monotonic() > deadline:
                    self._kill_pool()
                    why = "failed" if failed else f"did not start within {self.startup_timeout_s:.0f}s"
                    raise RuntimeError(f"reward worker processes {why} (can they import {self.fn!r}?)")
            wait(probes)
        return self._pool

    def _kill_pool(self) -> None:
        """Terminate the workers (some are hung, so a polite shutdown would wait forever)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + 1.0
        for proc in processes:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)

    def _score_in_processes(self, calls: list[tuple]) -> list[_Result]:
        results: list[_Result | None] = [None] * len(calls)
        todo = list(range(len(calls)))
        while todo:
            broken, todo = self._run_round(todo, calls, results)
            for i in broken:  # re-run alone, so a crashing call cannot take others down with it
                again, _ = self._run_round([i], calls, results)
                if again:
                    results[i] = (_ERROR, 0.0)
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def _run_round(
        self, indices: list[int], calls: list[tuple], results: list[_Result | None]
    ) -> tuple[list[int], list[int]]:
        """Run `indices` on the pool, filling `results`. Returns (broken-pool calls, calls to re-run)."""
        pool = self._get_pool()
        futures: dict[Future, int] = {}
        broken: list[int] = []
        try:
            for i in indices:
                futures[pool.submit(_invoke, self.fn, self.fn_kwargs, *calls[i])] = i
        except BrokenProcessPool:
            broken = [i for i in indices if i not in futures.values()]
        order = list(futures)  # submission order = the order workers pick calls up
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=self.timeout_s, return_when=FIRST_COMPLETED)
            for fut in done:
                i = futures[fut]
                try:
                    results[i] = fut.result()
                except BrokenProcessPool:
                    broken.append(i)
                except Exception:  # e.g. an unpicklable reference
                    results[i] = (_ERROR, 0.0)
            if not done:  # no progress for timeout_s: the calls on the workers are hung
                running = [f for f in order if f in pending and f.running()]
                # The executor pre-queues calls beyond the busy workers and marks them running too;
                # they come last in submission order.
                hung = (running or [f for f in order if f in pending])[: self.num_workers]
                for fut in hung:
                    results[futures[fut]] = (_TIMEOUT, 0.0)
                self._kill_pool()
                return broken, [futures[f] for f in order if f in pending and f not in hung]
        if broken:
            self._kill_pool()
        return broken, []
