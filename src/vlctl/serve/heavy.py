"""The heavy work of `vlctl serve` (explain, clustering) in a process of its own.

Explain backpropagates through two ViTs (~0.2 s of CPU) and clustering runs k-means over the
whole store; in the process that answers the page both would hold the GIL for the Python parts
of torch and numpy and keep every search and steer request waiting behind them. So they run in
one worker process, started with the server, that builds its own copy of the state once (from a
picklable `factory`, e.g. the CLI's arguments), with few torch threads (one by default: on a
2-core machine the other core stays with the process answering searches) and optionally a lower
CPU priority (`nice`; under a load the heavy work then waits long, so it is off by default).

Each task has a process of its own, so a clustering job never waits behind a queue of explains.
The third task embeds the text queries of search and steer requests (`vlctl.serve.texts`): a
text tower's forward in the server process would wait for the interpreter lock after each of its
torch ops while the request threads run Python; that process runs at the server's priority.
`HeavyWorker.submit(name, *args)` returns a `concurrent.futures.Future` of what the task returns
(a plain dict: the same as `work.explain` / `work.cluster`, or text -> embedding). A worker that dies is replaced on the next submit;
the requests it was computing fail with `WorkerLost` (HTTP 503).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from vlctl.fsops import VlctlError

_STATE: Any = None  # the worker process's ServeState


class WorkerLost(VlctlError):
    """The heavy-work process died while computing a request (HTTP 503)."""


def _exit_with(parent: int) -> None:
    """End this worker when the server process is gone (killed, or stopped before it shut the
    pool down): an orphaned worker would hold its models in memory for ever."""
    import time

    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _init(factory: Callable[[], Any], threads: int, nice: int) -> None:
    global _STATE
    import signal

    # Ctrl-C in a terminal reaches the whole process group: the server stops these workers itself
    # (`HeavyWorker.shutdown`); on their own they would each die with a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True, name="vlctl-parent-watch").start()
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass  # not allowed here: the worker runs at the server's priority
    if threads:
        import torch

        torch.set_num_threads(threads)
    _STATE = factory()
    _STATE.warm()


def _ready() -> bool:
    return _STATE is not None


def _explain(row: int | None, pixels: np.ndarray | None, positive: str, negative: str | None, tree: bool) -> dict:
    from vlctl.serve import work

    if _STATE.explain is None:
        raise VlctlError("no explain set is served")
    return work.explain(_STATE.explain, row, positive, negative, tree, pixels=pixels)


def _cluster(collection: str, attribute: str, k: int | None, seed: int, per_cluster: int) -> dict:
    from vlctl.serve import work

    return work.cluster(_STATE.collection(collection), attribute, k, seed, per_cluster)


def _texts(collection: str, texts: list[str]) -> dict[str, np.ndarray]:
    """text -> (1, d) embedding, for each text the tower does not refuse (`Collection.cache_texts`)."""
    return _STATE.collection(collection).cache_texts(texts)


TASKS = {"explain": _explain, "cluster": _cluster, "texts": _texts}
INTERACTIVE = frozenset({"texts"})  # a request waits for it: never at the lower priority


class HeavyWorker:
    """One worker process per task of `TASKS`, each over its own `factory()` state, at `nice` lower
    priority with `threads` torch threads (0: torch's default)."""

    def __init__(self, factory: Callable[[], Any], threads: int = 1, nice: int = 0):
        self._args = (factory, threads, nice)
        self._lock = threading.Lock()
        self._pools = {name: self._start(name) for name in TASKS}

    def _start(self, name: str) -> ProcessPoolExecutor:
        import multiprocessing

        factory, threads, nice = self._args
        # spawn, not fork: the server process already runs torch's and uvicorn's threads.
        return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                                   initargs=(factory, threads, 0 if name in INTERACTIVE else nice))

    def wait_ready(self, timeout: float | None = None) -> None:
        """Start the processes now and wait until their state is loaded (VlctlError if one fails)."""
        try:
            for f in [self._submit(name, _ready) for name in TASKS]:
                f.result(timeout)
        except (BrokenProcessPool, WorkerLost) as e:
            raise VlctlError(f"serve: the heavy-work process failed to load the models ({e})") from None

    def submit(self, name: str, *args) -> Future:
        """`TASKS[name](*args)` in that task's process."""
        return self._submit(name, TASKS[name], *args)

    def _submit(self, name: str, fn: Callable, *args) -> Future:
        with self._lock:
            try:
                return self._wrap(self._pools[name].submit(fn, *args))
            except BrokenProcessPool:  # it died earlier: a fresh process for this and later requests
                self._pools[name].shutdown(wait=False, cancel_futures=True)
                self._pools[name] = self._start(name)
                return self._wrap(self._pools[name].submit(fn, *args))

    @staticmethod
    def _wrap(fut: Future) -> Future:
        out: Future = Future()

        def done(f: Future) -> None:
            if f.cancelled():
                out.cancel()
                return
            exc = f.exception()
            if isinstance(exc, BrokenProcessPool):
                exc = WorkerLost("the heavy-work process stopped while computing this request; retry")
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(f.result())

        fut.add_done_callback(done)
        return out

    def shutdown(self) -> None:
        """Stop every worker now (a running clustering is abandoned) and wait for them to exit, so
        the pools' queues and semaphores are released: a process that exits with them still open
        leaves multiprocessing's resource tracker warning about leaked semaphores. Idempotent."""
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
                proc.join(10)
            pool.shutdown(wait=True)
