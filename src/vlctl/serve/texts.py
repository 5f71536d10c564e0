"""Text queries of concurrent requests, embedded together before the requests run.

A text search or steer with a new text needs a forward of the collection's text tower. On a CPU
that forward is bound by reading the tower's weights (a MiniLM's six BERT layers: ~10 ms on one
core for one short text, about the same for a few), and in a request thread it keeps one of the
few request workers busy while the others wait. So the app, on its event loop, first hands each
uncached text to a `TextBatches`: texts that arrive while a forward runs are queued, and the next
forward embeds every queued text of the collection at once into its text-query cache: in the
heavy-work process of texts (`vlctl.serve.heavy`), where the forward does not share this
process's interpreter lock, or without that process on a thread here (one forward at a time per
collection). The request then runs as before and finds its text in the cache; a text the tower
refuses, or a cache that is off (`--text-cache 0`), leaves the request to embed (and report) its
text itself, so what a request answers never depends on the batching.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from vlctl.serve.state import Collection

log = logging.getLogger("vlctl.serve")


class TextBatches:
    """Per collection, the texts waiting for the next forward (only touched on the event loop).
    `heavy`: a `HeavyWorker` whose "texts" process runs the forwards (None: a thread here)."""

    def __init__(self, heavy: Any = None):
        self._heavy = heavy
        # without it, a thread per collection at most (each runs one forward at a time, under its
        # collection's lock): a MAD text does not wait behind a forward of the shapes' MiniLM
        self._executor = None if heavy is not None else ThreadPoolExecutor(max_workers=4,
                                                                           thread_name_prefix="vlctl-text")
        self._queued: dict[str, dict[str, asyncio.Future]] = {}  # collection -> text -> done when cached
        self._running: dict[str, asyncio.Task] = {}  # collection -> its forward loop

    async def cache(self, coll: Collection, text: str) -> None:
        """Return once `text` is in `coll`'s text-query cache (or could not be put there)."""
        if coll.encoder is None or coll.text_queries.size == 0 or coll.text_queries.get(text) is not None:
            return
        queued = self._queued.setdefault(coll.name, {})
        done = queued.get(text)
        if done is None:
            done = queued[text] = asyncio.get_running_loop().create_future()
            if coll.name not in self._running:
                self._running[coll.name] = asyncio.create_task(self._drain(coll))
        await asyncio.shield(done)  # a request that times out must not cancel the others' wait

    async def _drain(self, coll: Collection) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queued.get(coll.name):
                batch = self._queued.pop(coll.name)  # texts arriving from now on wait for the next forward
                try:
                    if self._heavy is None:
                        await loop.run_in_executor(self._executor, coll.cache_texts, list(batch))
                    else:
                        got = await asyncio.wrap_future(self._heavy.submit("texts", coll.name, list(batch)))
                        for text, q in got.items():
                            coll.keep_text(text, q)
                except Exception as e:  # noqa: BLE001 - a failed forward or a lost worker: each request embeds its own
                    log.warning("vlctl serve: text queries of %r embedded one by one (%s)", coll.name, e)
                finally:
                    for done in batch.values():
                        if not done.done():
                            done.set_result(None)
        finally:
            del self._running[coll.name]

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
