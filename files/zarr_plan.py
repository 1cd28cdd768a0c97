"""What each variable becomes in a zarr v3 output: its chunk (and shard) shape aligned
to the input's chunks, lossy or lossless, and the regions its tasks write."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .zarr_source import Variable

#: variables of fewer bytes go through losslessly: a bound buys nothing on a few chunks
#: of coordinates or parameters, and their values are often compared exactly
SMALL_BYTES = 64 << 10
#: what an element of a string variable is taken to weigh when its chunks are sized
STRING_ITEMSIZE = 64


@dataclass
class VarPlan:
    """One variable's output: ``chunks`` and ``shards`` (None: unsharded) in elements per
    axis; ``lossy`` (through the codec under ``bound``, an ErrorBound or PsnrTarget);
    ``note`` says why a variable goes through losslessly."""

    var: Variable
    chunks: tuple
    shards: tuple | None
    lossy: bool
    bound: object = None
    note: str = ""

    @property
    def unit(self) -> tuple:
        """The shape one task writes: a shard (written whole) or a chunk."""
        return self.shards or self.chunks

    def regions(self) -> list[tuple]:
        """((start, stop) per axis) of every task's region, in C order of the grid."""
        return grid_regions(self.var.shape, self.unit)

    def index_of(self, region: tuple) -> tuple:
        """The grid index of a task's region (its shard's or chunk's key)."""
        return tuple(a // u for (a, _), u in zip(region, self.unit, strict=True))


def grid_regions(shape: tuple, unit: tuple) -> list[tuple]:
    """((start, stop) per axis) of the blocks of ``unit`` elements per axis that tile an
    array of ``shape``, in C order; [()] for a 0-d array, [] for an empty one."""
    if not shape:
        return [()]
    if 0 in shape:
        return []
    axes = [range(0, n, u) for n, u in zip(shape, unit, strict=True)]
    return [
        tuple((a, min(a + u, n)) for a, u, n in zip(starts, unit, shape, strict=True))
        for starts in itertools.product(*axes)
    ]


def grow(base: tuple, shape: tuple, itemsize: int, target: int) -> tuple:
    """``base`` (elements per axis) multiplied along the leading axes, axis by axis, until
    it holds about ``target`` bytes or covers ``shape``: a multiple of ``base`` on every
    axis, so each output chunk reads whole input chunks."""
    out = [max(1, min(b, n)) for b, n in zip(base, shape, strict=True)]
    for axis in range(len(out)):
        nbytes = math.prod(out) * itemsize
        if nbytes >= target:
            break
        room = -(-shape[axis] // out[axis])  # multiples left on this axis
        factor = max(1, min(room, target // max(nbytes, 1)))
        out[axis] = min(out[axis] * factor, shape[axis]) if factor < room else shape[axis]
    return tuple(out)


def lossless_reason(var: Variable, plan, small_bytes: int = SMALL_BYTES) -> str:
    """Why ``var`` goes through losslessly under the file ``plan`` (files/plan.py), or ""
    when it is compressed by the plan's codec."""
    if var.dtype == "str":
        return "lossless: string data"
    dtype = np.dtype(var.dtype)
    if dtype.kind != "f":
        return f"lossless: {dtype.name} data takes no error bound"
    if plan.bound_for(var.path) is None and plan.codec.bounded:
        return "lossless: no bound"
    if not plan.compresses(np.empty(0, dtype)):
        return f"lossless: codec {plan.codec.name} does not take {dtype.name}"
    if var.coord:
        return "lossless: a coordinate is kept exact"
    if var.nbytes < small_bytes:
        return "lossless: small variable"
    return ""


def plan_variable(var: Variable, plan, shard_bytes: int | None) -> VarPlan:
    """The :class:`VarPlan` of ``var`` under the file ``plan``: chunks of whole input
    chunks, about ``plan.chunk_bytes``, or for a compressed variable ``plan.chunk_samples``
    samples (rows along the first axis) whole along the others."""
    itemsize = STRING_ITEMSIZE if var.dtype == "str" else np.dtype(var.dtype).itemsize
    shape = tuple(max(n, 1) for n in var.shape)
    note = lossless_reason(var, plan)
    chunks = grow(var.chunks or shape, shape, itemsize, plan.chunk_bytes) if var.shape else ()
    rows = None if note else plan.sample_rows(shape)
    if rows is not None:  # whole samples, as a shuffled DataLoader reads them
        chunks = (rows, *shape[1:])
    shards = None
    if shard_bytes and var.shape:
        grown = grow(chunks, shape, itemsize, shard_bytes)  # a shard holds whole chunks:
        shards = tuple(-(-g // c) * c for g, c in zip(grown, chunks, strict=True))  # round up
        shards = None if shards == chunks else shards
    bound = None if note else plan.bound_for(var.path)
    return VarPlan(var, chunks, shards, not note, bound, note)
