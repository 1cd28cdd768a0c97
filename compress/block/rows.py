"""Rows of one ``block`` chunk decoded on their own: :class:`RowsDecoder`.

A loader that keeps a chunk of several samples compressed decodes each sample when it is
needed, not the whole chunk each time (``loaders/kept_chunks.py``). The chunk's row index
(``index``: a few integers per row, from one pass over the payload's head) says where
each row's blocks start and what code a delta block carries in; ``decode`` then reads
only the bytes of the rows asked for, from a payload held contiguously or in
fixed-size pages. The values are exactly those a whole-chunk decode gives.
"""

from __future__ import annotations

import math

import numpy as np

from ..._util.scratch import scratch
from .kernels import rows as kr
from .kernels.layout import BLOCK

__all__ = ["RowsDecoder"]


class RowsDecoder:
    """Row ranges of one-chunk payloads of ``shape`` (rows along axis 0) and ``dtype``
    (float32 or float64), decoded with quantization step ``step`` (``pw``: pw_rel steps
    per block)."""

    def __init__(self, shape: tuple, dtype: np.dtype, pw: bool, step: float):
        if len(shape) < 1:
            raise ValueError("a rows decoder needs an array with a first axis")
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.rows = self.shape[0]
        self.row_elems = math.prod(self.shape[1:])
        self.n = self.rows * self.row_elems
        self.pw, self.step = bool(pw), float(step)

    def index(self, payload) -> np.ndarray:
        """The row index of ``payload`` (bytes-like): int64 (rows + 1, 5); ValueError
        where the payload is inconsistent or in a mode rows cannot be read from."""
        buf = np.frombuffer(payload, np.uint8)
        index = np.empty((self.rows + 1, kr.INDEX_COLUMNS), np.int64)
        nb = -(-self.n // BLOCK)
        with scratch(buf.size + 8, 16 * (nb + 1)) as (pad, starts):
            ok = kr.index_rows(
                buf,
                self.n,
                self.dtype.itemsize,
                self.pw,
                self.row_elems,
                index,
                starts.view(np.int64).reshape(nb + 1, 2),
                pad,
            )
        if not ok:
            raise ValueError(
                "block payload is inconsistent (corrupted or truncated) or not in a "
                "mode whose rows decode on their own"
            )
        return index

    def decode(self, pages, ids, size: int, index, r0: int, r1: int, out: np.ndarray) -> None:
        """Rows ``r0 .. r1 - 1`` into ``out`` (C-contiguous, (r1 - r0, *shape[1:]),
        ``dtype``) from the payload of ``size`` bytes laid in ``pages`` (uint8, (count,
        page bytes)) in the order of ``ids`` (int, one per page used; a contiguous
        payload: ``pages = payload.reshape(1, -1)``, ``ids = [0]``) whose row index is
        ``index``. ValueError for inconsistent bytes."""
        if not 0 <= r0 <= r1 <= self.rows:
            raise ValueError(f"rows {r0}..{r1 - 1} are outside the chunk's {self.rows} rows")
        want = (r1 - r0, *self.shape[1:])
        if out.shape != want or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous {self.dtype} of shape {want}")
        st = np.array([*index[r0, :3], *index[r1, 3:]], np.int64)
        flat = out.reshape(-1)
        e0, e1 = r0 * self.row_elems, r1 * self.row_elems
        ids = np.asarray(ids, np.int64)
        with scratch(size + 8) as (buf,):
            ok = kr.decode_range(
                pages, ids, self.n, self.dtype.itemsize, self.pw, self.step,
                e0, e1, st, flat, flat.view(np.uint8), buf,
            )  # fmt: skip
        if not ok:
            raise ValueError("block payload is inconsistent (corrupted or truncated)")
