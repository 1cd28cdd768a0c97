"""Tile codes under an ``abs`` bound and under a learned tolerance
(activation_offload/device/tiles.py):
every element within its bound for float16, bfloat16 and float32 of odd sizes with NaN,
infinities, zeros, constants, tiny and huge bounds; the slot's size from the element
count, dtype and bound alone; raw blocks exact; no host read; meta tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload.device.codes import DTYPES
from tensorpress.activation_offload.device.tiles import (
    BLOCK,
    compress_blocks,
    restore_blocks,
    smallest_size,
    worst_size,
)
from test_device_blocks import bits, tensors
from test_device_codes import refuse_host_reads


def assert_within_abs(x: torch.Tensor, y: torch.Tensor, tol: float) -> None:
    """Every finite element of ``y`` within ``tol`` of ``x`` (in float64), NaN where x is
    NaN, the same infinities, zero where x is zero."""
    assert y.shape == x.shape and y.dtype == x.dtype
    x64, y64 = x.double().reshape(-1), y.double().reshape(-1)
    assert torch.equal(torch.isnan(x64), torch.isnan(y64))
    inf = torch.isinf(x64)
    assert torch.equal(x64[inf], y64[inf])
    assert bool((y64[x64 == 0] == 0).all())
    fin = torch.isfinite(x64)
    if bool(fin.any()):
        err = float((x64[fin] - y64[fin]).abs().max())
        assert err <= tol, (err, tol)


def roundtrip(x: torch.Tensor, **bound) -> torch.Tensor:
    """Compress, check the slot's and the used prefix's sizes, restore from the compact
    record (and check the slot restores the same bits)."""
    slot, used = compress_blocks(x, **bound)
    kind = {k: bound[k] for k in ("rel", "abs") if k in bound}
    assert slot.numel() == worst_size(x.numel(), dtype=x.dtype, **kind)
    size = int(used)
    assert smallest_size(x.numel()) <= size <= slot.numel()
    y = restore_blocks(slot[:size].clone(), x.shape, x.dtype)
    assert torch.equal(bits(y), bits(restore_blocks(slot, x.shape, x.dtype)))
    return y


ABS = [0.0, 1e-30, 1e-6, 1e-3, 0.1, 10.0, 1e30]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=tensors(), tol=st.sampled_from(ABS))
def test_abs_every_element_within_the_bound(x, tol):
    assert_within_abs(x, roundtrip(x, abs=tol), tol)


def _range(x: torch.Tensor) -> float:
    fin = x.double()[torch.isfinite(x.double())]
    return float(fin.max() - fin.min()) if fin.numel() else 0.0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    x=tensors(),
    rel=st.sampled_from([1e-2, 1e-3]),
    learned=st.sampled_from([0.0, 1e-12, 1e-3, 0.05, 1.0, 1e6, math.inf, math.nan]),
    ceiling=st.sampled_from([0.02, 0.1, 0.5]),
)
def test_learned_tolerance_held_between_the_bound_and_the_ceiling(x, rel, learned, ceiling):
    e = torch.tensor([learned], dtype=torch.float64)
    y = roundtrip(x, rel=rel, learned=e, ceiling=ceiling)
    span = _range(x)
    tol = span * rel if math.isnan(learned) else min(max(learned, span * rel), span * ceiling)
    assert_within_abs(x, y, tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_abs_holds_codes_where_the_bound_allows_and_raw_bits_where_not(dtype):
    g = np.random.default_rng(3)
    x = torch.from_numpy(g.standard_normal(4 * BLOCK + 9)).to(dtype)
    slot, used = compress_blocks(x, abs=0.2)  # about 6 bits a value: far under raw
    assert int(used) < x.numel() * x.element_size() * 0.6
    assert_within_abs(x, restore_blocks(slot, x.shape, dtype), 0.2)
    # a bound finer than the dtype's spacing: every block raw, every bit kept (-0.0, NaN)
    x[3], x[5], x[8] = -0.0, math.nan, -math.inf
    slot, used = compress_blocks(x, abs=0.0)
    assert int(used) == slot.numel() == worst_size(x.numel(), dtype=dtype, abs=0.0)
    assert torch.equal(bits(restore_blocks(slot, x.shape, dtype)), bits(x))


def test_a_huge_abs_takes_no_bits_and_keeps_the_range():
    x = torch.randn(3 * BLOCK + 1)
    slot, used = compress_blocks(x, abs=1e30)
    assert int(used) == smallest_size(x.numel())
    y = restore_blocks(slot, x.shape, x.dtype)
    assert bool(((y >= x.min()) & (y <= x.max())).all())


def test_a_learned_tolerance_never_needs_more_than_the_rel_slot():
    # the worst rel tensor: every block holds both ends of the range
    x = torch.zeros(4 * BLOCK)
    x[1::2] = 1.0
    e = torch.tensor([0.0], dtype=torch.float64)
    slot, used = compress_blocks(x, rel=1e-2, learned=e, ceiling=0.05)
    assert slot.numel() == worst_size(x.numel(), 1e-2) and int(used) <= slot.numel()
    loose, used_loose = compress_blocks(x, rel=1e-2, learned=e + 0.04, ceiling=0.05)
    assert int(used_loose) < int(used)  # a coarser step: narrower blocks
    assert_within_abs(x, restore_blocks(loose, x.shape, x.dtype), 0.04)


@pytest.mark.parametrize("bound", [{"abs": 1e-3}, {"rel": 1e-2, "ceiling": 0.1}])
def test_making_and_restoring_read_nothing_back(monkeypatch, bound):
    x = torch.randn(1000)
    x[7], x[9] = math.nan, 0.0
    if "ceiling" in bound:
        bound = dict(bound, learned=torch.tensor([0.03], dtype=torch.float64))
    refuse_host_reads(monkeypatch)
    slot, used = compress_blocks(x, **bound)
    y = restore_blocks(slot, x.shape, x.dtype)
    monkeypatch.undo()
    assert_within_abs(x, y, 1e-3 if "abs" in bound else 0.03 * _range(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_meta_tensors_give_the_slot_from_the_dtype_and_the_bound(dtype):
    x = torch.empty(3, BLOCK + 1, device="meta", dtype=dtype)
    slot, used = compress_blocks(x, abs=1e-3)
    assert slot.device.type == "meta"
    assert slot.shape == (worst_size(x.numel(), dtype=dtype, abs=1e-3),)
    e = torch.empty(1, device="meta", dtype=torch.float64)
    slot, used = compress_blocks(x, rel=1e-5, learned=e, ceiling=1e-3)
    assert slot.shape == (worst_size(x.numel(), 1e-5, dtype=dtype),)
    assert used.shape == (1,) and restore_blocks(slot, x.shape, dtype).shape == x.shape


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rel": 1e-2, "abs": 1e-2}, "exactly one"),
        ({}, "exactly one"),
        ({"abs": -1.0}, "abs"),
        ({"abs": math.inf}, "abs"),
        ({"rel": 1e-2, "learned": torch.zeros(1, dtype=torch.float64)}, "ceiling"),
        ({"rel": 1e-2, "learned": torch.zeros(1, dtype=torch.float64), "ceiling": 1e-3}, "ceil"),
        ({"rel": 1e-2, "learned": torch.zeros(2, dtype=torch.float64), "ceiling": 0.1}, "one"),
    ],
)
def test_bad_bounds_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compress_blocks(torch.zeros(8), **kwargs)


@pytest.mark.parametrize("lo, hi", [(-3.0, 5.5), (0.0, 0.0), (1e-30, 3e-30), (-65504.0, 1e5)])
@pytest.mark.parametrize("mode, value", [("rel", 1e-2), ("rel", 0.3), ("abs", 1e-3), ("abs", 0.0)])
def test_the_device_tolerance_is_error_bounds(lo, hi, mode, value):
    """The device encodings resolve ``rel`` and ``abs`` as ``ErrorBound`` does, on float64
    device scalars, and their tolerance without a learned one is that one."""
    from tensorpress.activation_offload.device.tiles_torch import tolerance
    from tensorpress.compress.bounds import ErrorBound, range_tolerance

    bound = ErrorBound(mode, value)
    lo_t, hi_t = torch.tensor(lo, dtype=torch.float64), torch.tensor(hi, dtype=torch.float64)
    want = bound.resolve_range(lo, hi).tolerance
    got = range_tolerance(bound, lo_t, hi_t)
    assert got.dtype == torch.float64 and got.shape == () and float(got) == want
    assert float(tolerance(lo_t, hi_t, value, mode == "abs")) == want
    with pytest.raises(ValueError, match="pw_rel"):
        range_tolerance(ErrorBound("pw_rel", value), lo_t, hi_t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_device_range_is_the_finite_range(dtype):
    from tensorpress.compress.bounds import finite_range, tensor_range

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(1001, generator=g) * 50).to(dtype)
    x[::9], x[5], x[7] = math.nan, math.inf, -math.inf
    lo, hi = tensor_range(x)
    assert (float(lo), float(hi)) == finite_range(x.float().numpy())
    none = torch.tensor([math.nan, math.inf, -math.inf], dtype=dtype)
    assert [float(v) for v in tensor_range(none)] == [0.0, 0.0]
