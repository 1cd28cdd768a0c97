"""Error bounds: what the user asks for, and what the kernels need.

``abs``    |x - y| <= e for every element.
``rel``    |x - y| <= e * (max - min), max and min over the finite values of
           the whole array (the value range, as SZ3 and ZFP users mean it).
           On an array whose finite values are all equal (or that has none)
           the range is 0, so the bound resolves to 0: the data is stored
           losslessly, which for a constant array costs a few bytes.
``pw_rel`` |x - y| <= e * |x| point-wise: zeros stay exact, signs are kept.

A resolved bound is either ``abs`` with an absolute tolerance (``rel`` turns
into this) or ``pw_rel`` with its relative tolerance. This module is the one place
that happens, and the one place a finite value range is read: of a numpy array, of
an array read by rows, of a torch tensor (a host float or a device scalar).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .._util.threads import map_ordered

MODES = ("abs", "rel", "pw_rel")


@dataclass(frozen=True)
class ErrorBound:
    """An error bound as given (``mode``, ``value``) and, once resolved, ``tolerance``.

    ``tolerance`` is the absolute bound for ``abs``/``rel`` and the relative
    bound for ``pw_rel``; it is None until :meth:`resolve` has seen the data.
    """

    mode: str
    value: float
    tolerance: float | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown error-bound mode {self.mode!r}; use one of {MODES}")
        # a real number only: float("1e-3") and float(True) would pass a string or a flag
        # given by mistake as a bound
        if isinstance(self.value, (bool, np.bool_)) or not isinstance(self.value, numbers.Real):
            raise ValueError(
                f"{self.mode} bound must be a real number, got {self.value!r} "
                f"({type(self.value).__name__})"
            )
        value = float(self.value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{self.mode} bound must be a finite number >= 0, got {self.value!r}")
        object.__setattr__(self, "value", value)

    @classmethod
    def from_kwargs(cls, abs=None, rel=None, pw_rel=None) -> ErrorBound:  # noqa: A002
        """Build from ``abs=``/``rel=``/``pw_rel=`` keywords; exactly one must be given."""
        given = {k: v for k, v in (("abs", abs), ("rel", rel), ("pw_rel", pw_rel)) if v is not None}
        if len(given) != 1:
            raise ValueError(
                "give exactly one error bound: abs=..., rel=... or pw_rel=... "
                f"(got {', '.join(given) or 'none'})"
            )
        ((mode, value),) = given.items()
        return cls(mode, value)

    @property
    def resolved_mode(self) -> str:
        """``abs`` for abs and rel bounds, ``pw_rel`` for point-wise relative ones."""
        return "pw_rel" if self.mode == "pw_rel" else "abs"

    def resolve(self, data: np.ndarray, threads: int = 1) -> ErrorBound:
        """Return a copy whose ``tolerance`` is set for ``data`` (a float array); a rel
        bound reads the data's range on up to ``threads`` threads."""
        if self.mode != "rel":
            return ErrorBound(self.mode, self.value, self.value)
        return self.resolve_range(*finite_range(data, threads))

    def resolve_rows(self, source, chunk_rows: int) -> ErrorBound:
        """:meth:`resolve` for an array-like read by rows (an HDF5 dataset, a memory map):
        a rel bound reads its value range ``chunk_rows`` rows at a time."""
        if self.mode != "rel":
            return ErrorBound(self.mode, self.value, self.value)
        return self.resolve_range(*rows_range(source, chunk_rows))

    def resolve_tensor(self, t) -> ErrorBound:
        """:meth:`resolve` for a torch tensor on any device: a rel bound reads its value
        range there (one host synchronisation)."""
        if self.mode != "rel":
            return ErrorBound(self.mode, self.value, self.value)
        return self.resolve_range(*tensor_finite_range(t))

    def resolve_range(self, lo: float, hi: float) -> ErrorBound:
        """Return a copy resolved for data whose finite values span [lo, hi]."""
        if self.mode != "rel":
            return ErrorBound(self.mode, self.value, self.value)
        span = hi - lo
        if math.isfinite(span):
            tol = self.value * span
        else:  # the range of float64 data can overflow (-1e308 .. 1e308)
            tol = math.nextafter(self.value * hi - self.value * lo, 0.0)
        if not math.isfinite(tol):
            tol = float(np.finfo(np.float64).max)
        return ErrorBound(self.mode, self.value, tol)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "value": self.value, "tolerance": self.tolerance}

    @classmethod
    def from_dict(cls, d: dict) -> ErrorBound:
        return cls(d["mode"], d["value"], d.get("tolerance"))


#: arrays of at least this many elements have their range read on several threads
PARALLEL_RANGE_ELEMENTS = 1 << 20
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # read in parts


def finite_range(data: np.ndarray, threads: int = 1) -> tuple[float, float]:
    """(min, max) over the finite elements, as float64; (0, 0) when there are none.

    Large contiguous float32/float64 arrays are read in ``threads`` parts at once.
    """
    if data.size == 0:
        return 0.0, 0.0
    if threads > 1 and data.size >= PARALLEL_RANGE_ELEMENTS and data.dtype in _KERNEL_DTYPES:
        flat = np.ravel(data)  # a view when contiguous, else one copy
        cut = -(-flat.size // threads)
        # numpy's reductions (vectorized, GIL released) on each part: a scalar loop reads
        # far slower, and made two threads slower than one (benchmarks/thread_scaling.py);
        # a NaN propagates to the masked pass below
        cuts = range(0, flat.size, cut)
        parts = map_ordered(_min_max, [flat[a : a + cut] for a in cuts], threads)
        lo = float(np.min([p[0] for p in parts]))
        hi = float(np.max([p[1] for p in parts]))
    else:
        lo, hi = float(data.min()), float(data.max())
    if math.isfinite(lo) and math.isfinite(hi):  # the common case: no mask
        return lo, hi
    data = data[np.isfinite(data)]
    if data.size == 0:
        return 0.0, 0.0
    return float(data.min()), float(data.max())


def _min_max(part: np.ndarray) -> tuple[float, float]:
    """(min, max) of a 1-d float array, NaN when it holds one."""
    return float(part.min()), float(part.max())


def rows_range(source, chunk_rows: int) -> tuple[float, float]:
    """:func:`finite_range` of an array-like read ``chunk_rows`` rows at a time, so that no
    more than those rows are in memory at once (an HDF5 dataset larger than memory)."""
    shape = tuple(source.shape)
    if not shape:
        return finite_range(np.asarray(source[()]))
    lo, hi = math.inf, -math.inf
    for start in range(0, shape[0], max(1, chunk_rows)):
        block = np.asarray(source[start : start + chunk_rows])
        finite = block[np.isfinite(block)]
        if finite.size:
            lo, hi = min(lo, float(finite.min())), max(hi, float(finite.max()))
    return (0.0, 0.0) if lo > hi else (lo, hi)


def tensor_finite_range(t) -> tuple[float, float]:
    """:func:`finite_range` of a torch tensor on any device, as Python floats (one host
    synchronisation; two passes only when it holds NaN or an infinity)."""
    if t.numel() == 0:
        return 0.0, 0.0
    lo, hi = tensor_ends(t)
    if math.isfinite(lo) and math.isfinite(hi):  # the common case: one pass
        return lo, hi
    import torch  # only reached with a tensor in hand, so torch is there

    finite = t.isfinite()
    lo = torch.where(finite, t, math.inf).amin().to(torch.float64)
    hi = torch.where(finite, t, -math.inf).amax().to(torch.float64)
    lo, hi = torch.stack([lo, hi]).tolist()
    return (0.0, 0.0) if lo > hi else (lo, hi)


def tensor_ends(t) -> tuple[float, float]:
    """(min, max) of a non-empty torch tensor over all its elements (NaN and infinities
    count), as Python floats: one host synchronisation on a GPU; on the CPU, two ``item``
    calls cost less than stacking the pair first."""
    lo, hi = t.aminmax()
    if t.device.type == "cpu":
        return lo.item(), hi.item()
    import torch

    lo, hi = torch.stack([lo, hi]).to(torch.float64).tolist()
    return lo, hi


def range_tolerance(bound: ErrorBound, lo, hi):
    """:meth:`ErrorBound.resolve_range`'s tolerance for a range held in tensors: ``lo`` and
    ``hi`` float64 torch scalars on any device, read by no one on the host; the result is
    one too. ``rel`` scales the span ``hi - lo``, ``abs`` is its value. The callers range
    over float16, bfloat16 and float32 data, whose span float64 holds without overflow, so
    resolve_range's guard for an infinite span has nothing to do there (and would cost
    launches on the device)."""
    if bound.mode == "pw_rel":
        raise ValueError("a pw_rel bound has no single tolerance for a range; use abs or rel")
    scale = lo.new_ones(lo.shape) if bound.mode == "abs" else hi - lo
    return bound.value * scale


def tensor_range(flat):
    """:func:`finite_range` of a non-empty torch tensor, on its device with no host read:
    ``(lo, hi)`` float64 scalars, ``(0, 0)`` when no element is finite."""
    x = flat.double()
    fin = x.isfinite()
    lo = x.where(fin, math.inf).amin()
    hi = x.where(fin, -math.inf).amax()
    none = lo > hi
    return lo.where(~none, 0.0), hi.where(~none, 0.0)
