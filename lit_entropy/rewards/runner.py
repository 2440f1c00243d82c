"""Isolated reward execution: a crashing, hanging or NaN-returning reward scores 0 and is counted.

A reward is a picklable top-level function ``fn(prompt, completion, reference, **fn_kwargs) -> float``.

Modes. ``process`` runs calls in a ``ProcessPoolExecutor`` with the *spawn* context (the trainer
process runs vLLM and CUDA threads, so forking it is unsafe). ``inline`` calls the reward in this
process and catches its exceptions; it cannot stop a hung call, so it is meant for *trusted*
verifiers: bounded, never executing their input (the Countdown verifier, marked with
:func:`trusted_reward`). ``auto`` (the default) picks inline for trusted rewards and the isolated pool
for anything else (math-verify, user functions). Both count errors, non-finite values and timeouts the
same way; inline, a call that returns after more than ``timeout_s`` scores 0 as a timeout.

Process mode submits calls in chunks (one task per chunk, not per call: a per-call task costs more
in pickling and queueing than the Countdown verifier itself) and each worker reports every finished
call on a progress queue. Waiting works by progress: while calls keep finishing, everyone waits;
when no call has finished for ``timeout_s``, the call each busy worker is on is hung. Those score 0
as timeouts, the workers are killed, and the calls that had not finished are re-run on a fresh pool
(results already reported are kept). A batch therefore pays about ``timeout_s`` per round of hung
calls (``num_workers`` hang in parallel), not per call.

A worker that dies (``os._exit``, segfault, OOM kill) breaks the whole pool and every unfinished call
with it. The unfinished calls are then re-run one at a time on a fresh pool, so only the calls that
break it again are scored 0 as errors; the others get their real reward.

Spawned workers re-import the parent's ``__main__`` and the reward's module, which can take longer
than ``timeout_s``; a new pool is therefore warmed up (every worker started, reward module imported)
before any call is timed, within ``startup_timeout_s``. :meth:`RewardRunner.start` launches the
workers without waiting, so their start overlaps other start-up work (the rollout engine's). A pool
that cannot start raises RuntimeError: that is a configuration error, not a misbehaving reward.
Workers exit by themselves when the trainer process dies, even by SIGKILL.
"""

from __future__ import annotations

import logging
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
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)
_OK, _ERROR, _NON_FINITE, _TIMEOUT = "ok", "error", "non_finite", "timeout"
_Result = tuple[str, float]
MODES = ("auto", "inline", "process")
MAX_CHUNK = 64  # calls per task at most: a hang or crash re-runs at most this many calls
_channel: Any = None  # in a worker: the progress queue to the parent


class RewardTimeout(Exception):
    """Raise it from a reward that gave up on its own time limit (math-verify's, say): the call scores 0
    and is counted as a timeout, like a call the runner had to stop."""


def trusted_reward(fn: Callable) -> Callable:
    """Mark a reward as safe to run in the trainer's process under ``mode='auto'``: it is bounded in
    time and memory by construction and never executes or imports anything from its input."""
    fn.trusted_reward = True
    return fn


def is_trusted(fn: Callable) -> bool:
    return bool(getattr(fn, "trusted_reward", False))


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
    except RewardTimeout:
        return _TIMEOUT, 0.0
    except (Exception, SystemExit):
        return _ERROR, 0.0


def _invoke_chunk(fn: Callable, kwargs: dict, task: tuple[int, int], calls: list[tuple]) -> list[_Result]:
    """A chunk of calls in a worker; every finished call is reported at once (the parent keeps it even
    if a later call in the chunk hangs or kills the worker)."""
    _channel.put(("start", task, 0, None))
    results = []
    for k, call in enumerate(calls):
        result = _invoke(fn, kwargs, *call)
        _channel.put(("done", task, k, result))
        results.append(result)
    return results


def _init_worker(fn: Callable, channel: Any) -> None:
    """Worker start-up. Receiving `fn` here imports its module before any call is timed."""
    del fn
    global _channel
    _channel = channel
    # Ctrl-C goes to the whole process group; let the parent handle it, not every worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    channel.put(("ready", os.getpid(), 0, None))


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

    `total` accumulates `RewardStats` over every `score` call. `chunk_size`: calls per pool task
    (None: about four tasks per worker, at most ``MAX_CHUNK`` calls each).
    """

    def __init__(
        self,
        fn: Callable[..., float],
        *,
        timeout_s: float = 5.0,
        mode: str = "auto",
        num_workers: int = 2,
        fn_kwargs: dict | None = None,
        startup_timeout_s: float = 300.0,
        chunk_size: int | None = None,
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
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size must be an int >= 1 or None, got {chunk_size!r}")
        self.fn = fn
        self.fn_kwargs = dict(fn_kwargs or {})
        self.timeout_s = float(timeout_s)
        self.mode = ("inline" if is_trusted(fn) else "process") if mode == "auto" else mode
        self.num_workers = num_workers
        self.startup_timeout_s = float(startup_timeout_s)
        self.chunk_size = chunk_size
        self.total = RewardStats()
        self._pool: ProcessPoolExecutor | None = None
        self._channel: Any = None
        self._warned_timeout = False
        self._round = 0  # tags progress messages, so late ones from an earlier round are ignored
        self._starting: tuple[list[Future], float] | None = None  # probes and deadline of a pool starting
        if self.mode == "process":
            try:
                pickle.dumps((fn, self.fn_kwargs))
            except Exception as err:
                raise ValueError(
                    f"mode='process' needs a picklable top-level fn and fn_kwargs ({err}); "
                    "define the reward at module level or use mode='inline'"
                ) from err

    # ------------------------------------------------------------------ public API

    def start(self) -> None:
        """Launch the worker pool without waiting for it (process mode; a no-op otherwise)."""
        if self.mode == "process" and self._pool is None:
            self._launch_pool()

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
            results = [self._invoke_inline(call) for call in calls]
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
        if stats.timeouts and not self._warned_timeout:
            self._warned_timeout = True
            log.warning("%d of %d reward calls timed out (no result within timeout_s=%gs, or the verifier's own "
                        "limit); they score 0 and are counted in rollout/reward_errors (warned once)",
                        stats.timeouts, stats.calls, self.timeout_s)
        return [reward for _, reward in results], stats

    def close(self) -> None:
        """Shut the worker pool down (a later `score` starts a new one)."""
        pool, self._pool, self._starting = self._pool, None, None
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

    # ------------------------------------------------------------------ inline mode

    def _invoke_inline(self, call: tuple) -> _Result:
        t0 = time.perf_counter()
        result = _invoke(self.fn, self.fn_kwargs, *call)
        return (_TIMEOUT, 0.0) if time.perf_counter() - t0 > self.timeout_s else result

    # ------------------------------------------------------------------ process mode

    def _launch_pool(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._channel = ctx.Queue()
        self._pool = ProcessPoolExecutor(
            max_workers=self.num_workers, mp_context=ctx, initializer=_init_worker, initargs=(self.fn, self._channel)
        )
        # With spawn, the executor starts one worker per submit while none is idle: this starts all.
        probes = [self._pool.submit(_noop) for _ in range(self.num_workers)]
        self._starting = (probes, time.monotonic() + self.startup_timeout_s)

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._launch_pool()
        if self._starting is not None:
            probes, deadline = self._starting
            started = 0
            while started < self.num_workers:
                try:
                    kind, *_ = self._channel.get(timeout=0.05)
                    started += kind == "ready"
                    continue
                except queue.Empty:
                    pass
                failed = any(p.done() and p.exception() is not None for p in probes)
                if failed or time.monotonic() > deadline:
                    self._kill_pool()
                    why = "failed" if failed else f"did not start within {self.startup_timeout_s:.0f}s"
                    raise RuntimeError(f"reward worker processes {why} (can they import {self.fn!r}?)")
            wait(probes)
            self._starting = None
        assert self._pool is not None
        return self._pool

    def _kill_pool(self) -> None:
        """Terminate the workers (some are hung, so a polite shutdown would wait forever)."""
        pool, self._pool, self._starting = self._pool, None, None
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

    def _chunks(self, indices: list[int]) -> list[list[int]]:
        size = self.chunk_size or max(1, min(MAX_CHUNK, -(-len(indices) // (4 * self.num_workers))))
        return [indices[k : k + size] for k in range(0, len(indices), size)]

    def _run_round(
        self, indices: list[int], calls: list[tuple], results: list[_Result | None]
    ) -> tuple[list[int], list[int]]:
        """Run `indices` on the pool, filling `results`. Returns (calls to re-run alone, calls to re-run):
        the first are the unfinished calls of a chunk that broke the pool or failed as a whole (e.g. one
        unpicklable reference), so the call at fault is found without failing its neighbours."""
        pool = self._get_pool()
        self._round += 1
        chunks = self._chunks(indices)
        futures: dict[Future, int] = {}
        finished = [0] * len(chunks)  # calls of each chunk reported done (they finish in order)
        started: set[int] = set()
        broken: list[int] = []
        pool_broke = False
        try:
            for cid, chunk in enumerate(chunks):
                task = (self._round, cid)
                futures[pool.submit(_invoke_chunk, self.fn, self.fn_kwargs, task, [calls[i] for i in chunk])] = cid
        except BrokenProcessPool:
            broken = [i for cid in range(len(futures), len(chunks)) for i in chunks[cid]]
            pool_broke = True

        def drain(timeout: float) -> bool:
            """Read progress messages; True when a call finished."""
            progressed = False
            while True:
                try:
                    kind, task, k, result = self._channel.get(timeout=timeout)
                except queue.Empty:
                    return progressed
                timeout = 0.0
                if kind == "ready" or task[0] != self._round:  # late news of an earlier round
                    continue
                cid = task[1]
                if kind == "start":
                    started.add(cid)
                elif kind == "done":
                    results[chunks[cid][k]] = result
                    finished[cid] = max(finished[cid], k + 1)
                    progressed = True

        pending = set(futures)
        last_progress = time.monotonic()
        while pending:
            if drain(0.02):
                last_progress = time.monotonic()
            for fut in [f for f in pending if f.done()]:
                pending.discard(fut)
                cid = futures[fut]
                last_progress = time.monotonic()
                try:
                    for k, result in enumerate(fut.result()):
                        results[chunks[cid][k]] = result
                    finished[cid] = len(chunks[cid])
                except BrokenProcessPool:
                    drain(0.05)  # keep what the dead worker reported before it died
                    broken.extend(chunks[cid][finished[cid] :])
                    pool_broke = True
                except Exception:  # e.g. an unpicklable reference: alone, the call at fault is an error
                    if len(chunks[cid]) == 1:
                        results[chunks[cid][0]] = (_ERROR, 0.0)
                    else:
                        broken.extend(chunks[cid][finished[cid] :])
            if pending and time.monotonic() - last_progress > self.timeout_s:
                # No call finished for timeout_s: the call each busy worker is on is hung.
                running = sorted(futures[f] for f in pending if futures[f] in started)
                hung_chunks = running or sorted(futures[f] for f in pending)[: self.num_workers]
                hung = [chunks[cid][finished[cid]] for cid in hung_chunks[: self.num_workers]]
                for i in hung:
                    results[i] = (_TIMEOUT, 0.0)
                self._kill_pool()
                rerun = [i for f in pending for i in chunks[futures[f]][finished[futures[f]] :] if i not in hung]
                return broken, sorted(rerun)
        if pool_broke:
            self._kill_pool()
        return broken, []
