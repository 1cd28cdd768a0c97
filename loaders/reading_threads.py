"""Workers as threads of the loading process, where no user code needs a worker process.

With a ``ChunkedDataset``, no ``transform``, torch's collate function and no
``worker_init_fn``, nothing a user wrote runs in a worker, so the workers can be threads:
batch ``first + i`` goes to thread ``i % workers``, the threads share one reader (its
buffer of the whole ``buffer_bytes``, planned with every batch of the iteration, so the
chunk-mates one thread decodes serve the others' batches), reads release the GIL, and a
batch reaches the training loop without a copy through shared memory (see
benchmarks/loader.py, which runs both kinds of worker).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from .batches import BatchToken
from .chunk_reader import ChunkedBatches

__all__ = ["ReadingThreads"]


class ReadingThreads:
    """Batches read by ``threads`` threads through the one ``reader`` they share,
    ``prefetch_factor`` batches ahead per thread, yielded in order; ``timeout`` seconds
    per batch (0: none)."""

    def __init__(self, reader: ChunkedBatches, threads: int, prefetch_factor: int, timeout: float):
        self.reader, self.threads = reader, threads
        self.prefetch_factor, self.timeout = prefetch_factor, timeout
        self._running: tuple | None = None  # (pools, pending) of the running iteration

    @property
    def running(self) -> bool:
        """Whether an iteration is reading now."""
        return self._running is not None

    def iterate(self, tokens: Iterator[list[BatchToken]], pin: bool) -> Iterator[Any]:
        """The batches of ``tokens`` (pinned if ``pin``). A newer iteration stops this
        one: the threads share the reader's buffer."""
        self.stop()
        n = self.threads
        pools = [
            ThreadPoolExecutor(1, thread_name_prefix=f"tensorpress-loader-{i}") for i in range(n)
        ]
        pending: collections.deque = collections.deque()
        mine = self._running = (pools, pending)
        try:
            for i, (token,) in enumerate(tokens):
                self._check(mine)
                pending.append(pools[i % n].submit(_read_batch, self.reader, token, pin))
                if len(pending) >= n * self.prefetch_factor:
                    yield self._wait(pending.popleft(), mine)
            while pending:
                yield self._wait(pending.popleft(), mine)
        finally:
            if self._running is mine:
                self.stop()

    def stop(self) -> None:
        """Cancel the running iteration's queued batches and wait for the rest."""
        if self._running is None:
            return
        pools, pending = self._running
        self._running = None
        for future in pending:
            future.cancel()
        for pool in pools:
            pool.shutdown(wait=True)

    def _check(self, mine: tuple) -> None:
        if self._running is not mine:
            raise RuntimeError(
                "this DataLoader iterator was stopped by a newer iteration of the same "
                "loader (one iteration at a time)"
            )

    def _wait(self, future: Future, mine: tuple) -> Any:
        self._check(mine)
        try:
            return future.result(timeout=self.timeout or None)
        except FutureTimeout:
            raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds") from None


def _read_batch(reader: ChunkedBatches, token: BatchToken, pin: bool) -> Any:
    """One collated batch read by a reading thread, pinned if ``pin``."""
    batch = reader.fetch_collated(token)
    if not pin:
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    return [t.pin_memory() for t in batch]
