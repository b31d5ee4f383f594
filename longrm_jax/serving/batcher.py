"""Concurrent requests computed together: a queue of work items (token sequences to score, prompts to judge)
that one worker drains into model calls (``RequestBatcher``), or that a generator admits into its running
decode as slots free up (``LiveBatcher``: a judge on one device).

A request's items join the queue and the request waits for their results. The worker takes what is queued,
waiting at most ``max_delay_ms`` after the first item for others to join, up to ``batch_size`` items and
``max_batch_tokens`` tokens; the model call itself buckets them by length (``evaluation.scoring.DisRMScorer``) or
decodes them with continuous batching (the judge's generator). An item whose request went away (its client
disconnected) is dropped before its turn; a full queue refuses new work (:class:`QueueFull`, answered 503). One
model call runs at a time, in a worker thread, so the event loop keeps answering while the device computes.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


class QueueFull(RuntimeError):
    """More sequences are waiting than the server's ``max_queue``."""


@dataclass
class _Item:
    payload: object  # what the model call takes for this item (a token sequence, a prompt)
    tokens: int  # its length in tokens, for the batch's token budget
    future: asyncio.Future


@dataclass
class BatchStats:
    """What the batcher did, for ``GET /metrics``."""

    batches: int = 0
    items: int = 0
    tokens: int = 0
    dropped: int = 0  # items whose request was gone before their turn
    busy_s: float = 0.0  # seconds in model calls
    batch_sizes: list = field(default_factory=list)  # the last batches' sizes (bounded)


class _Submissions:
    """What both batchers share: a bounded queue of items and a request's wait for its items' results."""

    queue: list[_Item]
    max_queue: int

    @property
    def pending(self) -> int:
        return len(self.queue)

    async def submit(self, payloads: Sequence, tokens: Sequence[int]) -> list:
        if self.pending + len(payloads) > self.max_queue:
            raise QueueFull(f"{self.pending} items are waiting (max_queue {self.max_queue})")
        loop = asyncio.get_running_loop()
        items = [_Item(payload, int(n), loop.create_future()) for payload, n in zip(payloads, tokens)]
        self._enqueue(items)
        try:
            return list(await asyncio.gather(*(item.future for item in items)))
        finally:  # a request cancelled (its client went away): its items are dropped before their turn
            for item in items:
                item.future.cancel()

    def _enqueue(self, items: list[_Item]) -> None:
        raise NotImplementedError


class RequestBatcher(_Submissions):
    """``await batcher.submit(payloads, tokens)`` -> ``compute(payloads of a batch)``'s result for each payload,
    computed together with other requests' items."""

    def __init__(self, compute: Callable[[list], Sequence], *, batch_size: int, max_batch_tokens: int,
                 max_delay_ms: float, max_queue: int):
        self.compute = compute
        self.batch_size, self.max_batch_tokens = batch_size, max_batch_tokens
        self.max_delay_s, self.max_queue = max_delay_ms / 1000, max_queue
        self.queue: list[_Item] = []
        self.stats = BatchStats()
        self._wake = asyncio.Event()
        self._worker: asyncio.Task | None = None

    def start(self) -> None:
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    def _enqueue(self, items: list[_Item]) -> None:
        self.queue.extend(items)
        self._wake.set()

    def _take(self) -> list[_Item]:
        """The next batch: queued items in order, at most batch_size of them and max_batch_tokens tokens (always
        at least one); items of cancelled requests are dropped."""
        live = [item for item in self.queue if not item.future.done()]
        self.stats.dropped += len(self.queue) - len(live)
        batch, tokens = [], 0
        for item in live:
            if batch and (len(batch) == self.batch_size or tokens + item.tokens > self.max_batch_tokens):
                break
            batch.append(item)
            tokens += item.tokens
        self.queue = live[len(batch):]
        return batch

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.queue:
                continue
            deadline = time.monotonic() + self.max_delay_s
            while len(self.queue) < self.batch_size and time.monotonic() < deadline:
                await asyncio.sleep(min(0.001, max(0.0, deadline - time.monotonic())))
            batch = self._take()
            if self.queue:
                self._wake.set()
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = await asyncio.to_thread(self.compute, [item.payload for item in batch])
            except Exception as error:  # noqa: BLE001 - the requests of this batch get the error, the server goes on
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(error)
                continue
            self.stats.busy_s += time.perf_counter() - started
            self.stats.batches += 1
            self.stats.items += len(batch)
            self.stats.tokens += sum(item.tokens for item in batch)
            self.stats.batch_sizes = (self.stats.batch_sizes + [len(batch)])[-1000:]
            for item, value in zip(batch, results):
                if not item.future.done():
                    item.future.set_result(value)


class LiveBatcher(_Submissions):
    """``await batcher.submit(payloads, tokens)`` -> each payload's generation, for a generator that admits
    prompts while it decodes (continuous batching across requests: ``GreedyGenerator.generate_live``).

    A payload is (prompt token ids, token budget). ``run(source)`` runs in a worker thread for the server's life,
    taking payloads from this batcher (an ``evaluation.grm.continuous.LiveSource``) as slots free up; a request
    waits no batching delay. Items of a request that went away are dropped before they start; a full queue refuses
    new work (:class:`QueueFull`)."""

    def __init__(self, run: Callable[[object], None], *, max_queue: int):
        import threading  # noqa: PLC0415

        self.run, self.max_queue = run, max_queue
        self.queue: list[_Item] = []
        self.stats = BatchStats()
        self.stopping = False
        self._lock = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Future | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._worker = asyncio.ensure_future(asyncio.to_thread(self.run, self))

    async def stop(self) -> None:
        with self._lock:
            self.stopping = True
            self._lock.notify_all()
        if self._worker is not None:
            await asyncio.gather(self._worker, return_exceptions=True)

    def _enqueue(self, items: list[_Item]) -> None:
        with self._lock:
            self.queue.extend(items)
            self._lock.notify_all()

    # The worker thread's side (evaluation.grm.continuous.LiveSource).

    def next_length(self, timeout: float) -> int | None:
        with self._lock:
            self._drop_cancelled()
            if not self.queue and not self.stopping:
                self._lock.wait(timeout)
                self._drop_cancelled()
            return self.queue[0].tokens if self.queue else None

    def take(self, limit: int, bucket: int) -> list:
        from longrm_jax.evaluation.grm.continuous import LiveItem  # noqa: PLC0415 - jax loads with the model

        with self._lock:
            self._drop_cancelled()
            taken = []
            while self.queue and len(taken) < limit and self.queue[0].tokens <= bucket:
                taken.append(self.queue.pop(0))
        self.stats.items += len(taken)
        self.stats.tokens += sum(item.tokens for item in taken)
        return [LiveItem(prompt=item.payload[0], budget=item.payload[1],
                         deliver=functools.partial(self._deliver, item.future),
                         abandoned=functools.partial(self._abandoned, item.future)) for item in taken]

    def record_pool(self, seconds: float, slots: int) -> None:
        """One pool run (``GET /metrics``: batches are pools, their sizes the pools' slots)."""
        self.stats.batches += 1
        self.stats.busy_s += seconds
        self.stats.batch_sizes = (self.stats.batch_sizes + [slots])[-1000:]

    def _abandoned(self, future: asyncio.Future) -> bool:
        if future.done():  # cancelled: its request went away while it decoded
            self.stats.dropped += 1
            return True
        return False

    def _drop_cancelled(self) -> None:
        live = [item for item in self.queue if not item.future.done()]
        self.stats.dropped += len(self.queue) - len(live)
        self.queue = live

    def _deliver(self, future: asyncio.Future, result) -> None:
        def settle():
            if future.done():
                return
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

        self._loop.call_soon_threadsafe(settle)
