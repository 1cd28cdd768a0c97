"""One error bound for a whole zarr array, whatever chunk a codec sees.

zarr hands a codec one chunk at a time, so a ``rel`` bound resolved there is relative
to that chunk's range. Here ``rel`` and ``psnr`` are resolved once, against the whole
array's finite value range (a numpy array, a Dask array in one distributed reduction,
an xarray DataArray, or a range the caller already knows), into the absolute bound
every chunk is then compressed with:

``rel``   ``abs = rel * (hi - lo)``, as :class:`~tensorpress.compress.ErrorBound` does
          for a whole array (``tp.compress``, the CLI).
``psnr``  ``abs = (hi - lo) * 10 ** (-psnr / 20)``: every error within ``abs`` keeps the
          mean squared error within ``abs**2``, so the PSNR over the array is at least
          ``psnr`` dB on any data. (The CLI's ``--psnr`` on one file searches for a
          looser bound by compressing; a chunked store cannot, so this is the floor
          that bound search starts from.)
"""

from __future__ import annotations

import math
import numbers
import sys

import numpy as np

from ..compress.bounds import ErrorBound, finite_range
from ..compress.quality import safe_bound
from .missing import MissingSpec

__all__ = [
    "bound_setup",
    "cf_missing",
    "clamp_bounds",
    "fixed_bound",
    "missing_values",
    "one_bound",
    "resolve_bound",
    "valid_pair",
    "value_range",
]

#: the bounds this module resolves against a value range
RANGE_MODES = ("rel", "psnr")


def value_range(source, missing=None) -> tuple[float, float]:
    """``(lo, hi)``: min and max over the finite values of ``source`` (float64; ``(0, 0)``
    when there are none), leaving out the cells ``missing`` marks.

    ``source`` is a numpy array, a Dask array (reduced where its chunks live, one pass
    for both ends), an xarray DataArray (its ``.data``), or a ``(lo, hi)`` pair, which is
    checked and returned. ``missing`` is a fill value, a sequence of them, or a
    :class:`~tensorpress.formats.missing.MissingSpec` (CF ``_FillValue``/``valid_range``).
    """
    if isinstance(source, (tuple, list)):
        return _checked_pair(source)
    data = source.data if _is_a(source, "xarray", "DataArray") else source
    _no_bfloat16(data)
    if _is_a(data, "dask.array", "Array"):
        return _dask_range(data, missing)
    arr = np.asarray(data)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"the value range of a {arr.dtype} array is undefined: give numbers")
    if missing is not None:
        arr = arr[~_mask(arr, missing)]
    return finite_range(arr)


def resolve_bound(source, *, rel=None, psnr=None, missing=None) -> float:
    """The absolute bound (in the data's units) that ``rel`` or ``psnr`` (dB) means for
    the whole of ``source`` (anything :func:`value_range` takes)."""
    mode, value = one_bound(rel=rel, psnr=psnr)
    return fixed_bound(mode, value, value_range(source, missing)).tolerance


def cf_missing(data) -> tuple[float, ...]:
    """The CF missing values (``_FillValue``, ``missing_value``) an xarray DataArray is
    written with: from its ``encoding``, else its ``attrs``; NaN left out (it needs no
    marker). ``()`` for anything that is not a DataArray."""
    if not _is_a(data, "xarray", "DataArray"):
        return ()
    found = []
    for key in ("_FillValue", "missing_value"):
        value = data.encoding.get(key, data.attrs.get(key))
        if value is not None:
            found.extend(np.atleast_1d(np.asarray(value, dtype=np.float64)).tolist())
    return tuple(v for v in found if not math.isnan(v))


def fixed_bound(mode: str, value, lo_hi) -> ErrorBound:
    """The resolved :class:`ErrorBound` of ``mode`` (``rel`` or ``psnr``) ``value`` over
    the value range ``lo_hi``: ``rel`` stays a rel bound with its tolerance set, ``psnr``
    becomes ``abs``."""
    lo, hi = _checked_pair(lo_hi)
    if mode == "rel":
        return ErrorBound("rel", value).resolve_range(lo, hi)
    if mode != "psnr":
        raise ValueError(f"value_range goes with rel or psnr, not {mode}: {mode} needs no range")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"psnr must be a number of dB, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"psnr must be a finite number of dB, got {value!r}")
    tol = safe_bound(hi - lo, float(value))
    if not math.isfinite(tol):  # a float64 range that overflows: the largest bound there is
        tol = float(np.finfo(np.float64).max)
    return ErrorBound("abs", tol, tol)


def one_bound(**given) -> tuple[str, float]:
    """``(name, value)`` of the one keyword of ``given`` that is not None, or ValueError."""
    named = {k: v for k, v in given.items() if v is not None}
    if len(named) != 1:
        raise ValueError(
            f"give exactly one of {', '.join(f'{k}=' for k in given)} "
            f"(got {', '.join(named) or 'none'})"
        )
    return next(iter(named.items()))


def missing_values(missing) -> tuple[float, ...]:
    """The config's ``missing``: a number or a list of them, as a tuple of floats."""
    if missing is None:
        return ()
    values = missing if isinstance(missing, (list, tuple)) else [missing]
    if not all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in values):
        raise ValueError(f"missing must be a number or a list of numbers, got {missing!r}")
    return tuple(float(v) for v in values)


def valid_pair(valid_range) -> tuple | None:
    """The config's ``valid_range``: ``(lo, hi)`` floats (one of them None: unbounded on
    that side), or None when not given; ValueError for anything else."""
    if valid_range is None:
        return None
    bad = ValueError(
        "valid_range must be [lo, hi]: numbers with lo <= hi, or null for an open side, "
        f"e.g. [0, null]; got {valid_range!r}"
    )
    if not isinstance(valid_range, (list, tuple)) or len(valid_range) != 2:
        raise bad
    out = []
    for v in valid_range:
        if v is not None and (not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_))):
            raise bad
        if v is not None and math.isnan(v):
            raise bad
        out.append(None if v is None else float(v))
    lo, hi = out
    if (lo is None and hi is None) or (lo is not None and hi is not None and lo > hi):
        raise bad
    return lo, hi


def clamp_bounds(valid: tuple, dtype: np.dtype) -> tuple:
    """``valid`` (lo, hi) as values of float ``dtype`` inside it (rounded inwards), so a
    value clamped to them lies in the range: the largest such interval."""
    lo, hi = valid
    t = dtype.type
    if lo is not None:
        lo_t = t(lo)
        lo = np.nextafter(lo_t, t(np.inf)) if float(lo_t) < lo else lo_t
    if hi is not None:
        hi_t = t(hi)
        hi = np.nextafter(hi_t, t(-np.inf)) if float(hi_t) > hi else hi_t
    return lo, hi


def bound_setup(abs, rel, pw_rel, psnr, value_range, resolved_abs):  # noqa: A002
    """The codec's bound keywords, the bound fixed for every chunk (None: resolved per
    chunk) and the config that records it, from a numcodecs codec's bound keywords."""
    if value_range is None:
        if psnr is not None or resolved_abs is not None:
            raise ValueError(
                f"{'psnr' if psnr is not None else 'resolved_abs'} goes with value_range=(lo, "
                "hi), the whole array's range: for_array(data, psnr=...) finds it"
            )
        return {"abs": abs, "rel": rel, "pw_rel": pw_rel}, None, None
    mode, value = one_bound(abs=abs, rel=rel, pw_rel=pw_rel, psnr=psnr)
    if mode not in RANGE_MODES:
        raise ValueError(f"value_range goes with rel or psnr, not {mode}: {mode} needs no range")
    fixed = fixed_bound(mode, value, value_range)
    if resolved_abs is not None:
        fixed = _agreed(fixed, resolved_abs, f"{mode}={value!r} over {list(value_range)!r}")
    record = {mode: float(value), "value_range": [float(v) for v in value_range]}
    record["resolved_abs"] = fixed.tolerance
    return ({"rel": value} if mode == "rel" else {"abs": fixed.tolerance}), fixed, record


def _agreed(fixed: ErrorBound, resolved_abs, meaning: str) -> ErrorBound:
    """``fixed`` held to a config's ``resolved_abs``: another writer may round the same
    product differently (1e-9 relative is allowed, and the smaller bound kept, so both
    hold); anything further off is an edited config."""
    ok = isinstance(resolved_abs, numbers.Real) and not isinstance(resolved_abs, bool)
    if not (ok and math.isclose(resolved_abs, fixed.tolerance, rel_tol=1e-9)):
        raise ValueError(
            f"resolved_abs {resolved_abs!r} is not what {meaning} means "
            f"({fixed.tolerance!r}): the config was edited"
        )
    tol = min(float(resolved_abs), fixed.tolerance)
    return ErrorBound(fixed.mode, fixed.value if fixed.mode == "rel" else tol, tol)


def _checked_pair(pair) -> tuple[float, float]:
    """``pair`` as two finite floats ``lo <= hi``, or ValueError."""
    try:
        lo, hi = (float(v) for v in pair)
    except (TypeError, ValueError):
        raise ValueError(f"value_range must be two numbers (lo, hi), got {pair!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"value_range must be finite numbers with lo <= hi, got {pair!r}")
    return lo, hi


def _no_bfloat16(data) -> None:
    """TypeError for bfloat16 data (a numpy or torch dtype), which the zarr codecs do not
    compress: say what to give instead, not what numpy makes of it."""
    if str(getattr(data, "dtype", "")).removeprefix("torch.") == "bfloat16":
        raise TypeError(
            "bfloat16 data: the zarr codecs, their value ranges and missing values take "
            "float16, float32 or float64; cast it first (x.astype(np.float32), t.float())"
        )


def _is_a(obj, module_name: str, class_name: str) -> bool:
    """Whether ``obj`` is a ``module_name.class_name``: such an object exists only where
    its module was imported, so nothing is imported here."""
    module = sys.modules.get(module_name)
    return module is not None and isinstance(obj, getattr(module, class_name))


def _mask(block: np.ndarray, missing) -> np.ndarray:
    """Which cells of ``block`` ``missing`` marks (see :func:`value_range`)."""
    if isinstance(missing, MissingSpec):
        return missing.mask(block)
    values = missing if isinstance(missing, (tuple, list, set)) else (missing,)
    return MissingSpec(block.dtype, tuple(values)).mask(block)


def _dask_range(x, missing) -> tuple[float, float]:
    """:func:`value_range` of a Dask array: each chunk's finite min and max where the
    chunk lives, then the min and max of those (one graph, the data read once)."""
    import dask

    if x.dtype.kind not in "fiu":
        raise TypeError(f"the value range of a {x.dtype} array is undefined: give numbers")
    if x.ndim == 0 or x.size == 0:
        return value_range(x.compute(), missing)
    # each chunk becomes a 2 x 2 x ... block: its min at [0, 0, ...], its max at [1, 1, ...]
    ends = x.map_blocks(
        _block_ends,
        missing,
        chunks=tuple((2,) * len(c) for c in x.chunks),
        meta=np.empty((0,) * x.ndim),  # no trial call to learn the output's type
    )
    lo, hi = dask.compute(
        ends[(slice(0, None, 2),) * x.ndim].min(), ends[(slice(1, None, 2),) * x.ndim].max()
    )
    lo, hi = float(lo), float(hi)
    return (lo, hi) if lo <= hi else (0.0, 0.0)  # (inf, -inf): no finite value anywhere


def _block_ends(block: np.ndarray, missing) -> np.ndarray:
    """What one chunk sends back for :func:`_dask_range`: a ``(2,) * ndim`` float64 block,
    the chunk's finite min at ``[0, 0, ...]`` and max at ``[1, 1, ...]`` (+inf and -inf
    when it has no finite value, so they never win)."""
    keep = np.isfinite(block)
    if missing is not None:
        keep &= ~_mask(block, missing)
    values = block[keep]
    out = np.zeros((2,) * block.ndim)
    out[(0,) * block.ndim] = values.min() if values.size else math.inf
    out[(1,) * block.ndim] = values.max() if values.size else -math.inf
    return out
