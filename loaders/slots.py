"""Preallocated slots for the samples (and labels) a loader's buffer holds."""

from __future__ import annotations

import numpy as np

__all__ = ["SampleSlots"]


class SampleSlots:
    """Up to ``count`` samples of ``shape``/``dtype`` (and labels of ``label_shape``/
    ``label_dtype``, or none), each in a slot of one array made once.

    The buffer's memory is then a single block of about its budget: its pages come in
    as slots are first filled and are reused after that, never a fresh allocation per
    sample (which page-faults every copy in and leaves freed memory in the reading
    threads' malloc arenas). ``put`` copies a sample into a free slot and returns the
    slot's number (None when all are taken), ``free`` gives a slot back, ``copy_to``
    copies a slot into a batch row.
    """

    def __init__(self, count: int, shape, dtype, label_shape=None, label_dtype=None):
        self._x = np.empty((count, *shape), dtype)
        self._y = None if label_shape is None else np.empty((count, *label_shape), label_dtype)
        self._count = count
        self._fresh = 0  # slots below this have been used
        self._freed: list[int] = []

    @property
    def taken(self) -> int:
        """Slots holding a sample."""
        return self._fresh - len(self._freed)

    def put(self, x: np.ndarray, y: np.ndarray | None) -> int | None:
        """A slot now holding a copy of ``x`` (and label ``y``), or None if none is free."""
        if self._freed:
            slot = self._freed.pop()
        elif self._fresh < self._count:
            slot, self._fresh = self._fresh, self._fresh + 1
        else:
            return None
        self._x[slot] = x
        if self._y is not None:
            self._y[slot] = y
        return slot

    def free(self, slot: int) -> None:
        """Give ``slot`` back; its contents may be overwritten from now on."""
        self._freed.append(slot)

    def copy_to(self, slot: int, xo: np.ndarray, yo: np.ndarray | None, row: int) -> None:
        """Batch row ``row`` of ``xo`` (and ``yo``) from ``slot``."""
        xo[row, ...] = self._x[slot]
        if yo is not None:
            yo[row, ...] = self._y[slot]
