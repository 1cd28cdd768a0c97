"""The separable multilevel lifting both wavelet paths share (sz/wavelet.py's integer
5/3, sz/cdf97.py's CDF 9/7): which block and axes each level transforms, and a row
kernel applied along every axis of a level, finest level first (the inverse: axes and
levels reversed)."""

from __future__ import annotations

import numpy as np


def plan(shape: tuple, levels: int, min_length: int) -> list[tuple[tuple, tuple]]:
    """``(block shape, axes transformed)`` per level, finest first: at most ``levels``,
    each transforming the axes of at least ``min_length`` elements of its low-pass
    block."""
    dims, steps = list(shape), []
    for _ in range(levels):
        axes = tuple(ax for ax, n in enumerate(dims) if n >= min_length)
        if not axes:
            break
        steps.append((tuple(dims), axes))
        for ax in axes:
            dims[ax] = (dims[ax] + 1) // 2
    return steps


def _along(block: np.ndarray, axis: int, kernel) -> None:
    """Apply the row ``kernel`` along ``axis`` of the view ``block``, in place."""
    view = np.moveaxis(block, axis, -1)
    rows = np.ascontiguousarray(view)
    kernel(rows.reshape(-1, rows.shape[-1]))
    view[...] = rows


def forward(arr: np.ndarray, steps: list, lift_rows) -> None:
    """The transform of ``arr`` by the levels ``steps`` (:func:`plan`), in place."""
    for dims, axes in steps:
        block = arr[tuple(slice(0, n) for n in dims)]
        for ax in axes:
            _along(block, ax, lift_rows)


def inverse(arr: np.ndarray, steps: list, unlift_rows) -> None:
    """Invert :func:`forward` in place (axes and levels reversed)."""
    for dims, axes in reversed(steps):
        block = arr[tuple(slice(0, n) for n in dims)]
        for ax in reversed(axes):
            _along(block, ax, unlift_rows)
