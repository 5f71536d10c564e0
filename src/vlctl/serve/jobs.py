"""Background jobs of `vlctl serve`: work longer than a request (clustering a large store) runs on a
small thread pool; the request gets a job id at once and the page polls `GET /api/jobs/{id}`.

Only the last `keep` jobs are remembered (an older id answers 404), and at most `max_pending`
may wait or run at once (more is a 429: the client is told to retry, nothing queues unboundedly).
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from vlctl.fsops import VlctlError
from vlctl.serve.state import NotFound


class TooManyJobs(VlctlError):
    """More jobs pending than the queue takes (HTTP 429)."""


class Jobs:
    def __init__(self, workers: int = 1, keep: int = 64, max_pending: int = 16):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vlctl-job")
        self._jobs: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._by_key: dict[Any, str] = {}
        self._lock = threading.Lock()
        self.keep, self.max_pending = keep, max_pending

    def submit(self, fn: Callable[[], Any], key: Any = None) -> dict:
        """Run `fn()` in the background; returns the job record. A job with the same `key` that is
        pending or done is returned instead of starting the same work twice."""
        with self._lock:
            jid = self._by_key.get(key) if key is not None else None
            if jid in self._jobs and self._jobs[jid]["status"] != "failed":
                return dict(self._jobs[jid])
            pending = sum(j["status"] in ("queued", "running") for j in self._jobs.values())
            if pending >= self.max_pending:
                raise TooManyJobs(f"jobs: {pending} jobs are pending (at most {self.max_pending}); retry shortly")
            jid = secrets.token_hex(8)
            job = {"id": jid, "status": "queued", "result": None, "error": None, "created": time.time()}
            self._jobs[jid] = job
            if key is not None:
                self._by_key[key] = jid
            while len(self._jobs) > self.keep:
                old, _ = self._jobs.popitem(last=False)
                self._by_key = {k: v for k, v in self._by_key.items() if v != old}
        self._pool.submit(self._run, job, fn)
        return dict(job)

    def _run(self, job: dict, fn: Callable[[], Any]) -> None:
        job["status"] = "running"
        try:
            job["result"] = fn()
            job["status"] = "done"
        except VlctlError as e:
            job["error"], job["status"] = str(e), "failed"
        except NotFound as e:
            job["error"], job["status"] = str(e.args[0]) if e.args else str(e), "failed"
        except Exception as e:  # noqa: BLE001 -- a bug: the job fails with its type, the server keeps running
            job["error"], job["status"] = f"internal error ({type(e).__name__})", "failed"

    def get(self, jid: str) -> dict:
        with self._lock:
            if jid not in self._jobs:
                raise NotFound(f"no job {jid!r} (finished jobs are kept for the last {self.keep})")
            return dict(self._jobs[jid])

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
