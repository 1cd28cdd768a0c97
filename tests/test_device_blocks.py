"""Block codes under a rel bound (activation_offload/device/tiles.py): every element within its
bound, the slot's size known from the element count, compaction to the bytes in use
(the compact record restores the same values), constant blocks that take no bits, the
custom ops on meta tensors, and the eager hooks' records compacted once their sizes
arrive."""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload import ActivationCompression
from tensorpress.activation_offload.device.codes import DTYPES, code_bits, payload_bytes
from tensorpress.activation_offload.device.tiles import (
    BLOCK,
    LaggedSize,
    compress_blocks,
    restore_blocks,
    smallest_size,
    worst_size,
)
from test_device_codes import assert_runs_under_the_triton_interpreter, refuse_host_reads

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def assert_within(x: torch.Tensor, y: torch.Tensor, rel: float) -> None:
    """Every finite element of ``y`` within rel of the finite range of ``x`` (compared in
    float64), NaN where x is NaN, the same infinities, +0.0 where x is zero."""
    assert y.shape == x.shape and y.dtype == x.dtype
    x64, y64 = x.double().reshape(-1), y.double().reshape(-1)
    fin = torch.isfinite(x64)
    assert torch.equal(torch.isnan(x64), torch.isnan(y64))
    inf = torch.isinf(x64)
    assert torch.equal(x64[inf], y64[inf])
    zero = x64 == 0
    assert bool((y64[zero] == 0).all()) and not bool(torch.signbit(y64[zero]).any())
    if bool(fin.any()):
        lo, hi = float(x64[fin].min()), float(x64[fin].max())
        err = (x64[fin] - y64[fin]).abs()
        assert float(err.max()) <= rel * (hi - lo), (float(err.max()), rel * (hi - lo))
        if hi == lo:
            assert torch.equal(x64[fin], y64[fin])


@st.composite
def tensors(draw):
    """float16/bfloat16/float32 tensors of odd sizes (mostly not multiples of a block):
    noise, constants, runs of zeros (a ReLU's output), outliers that set the range, the
    dtype's extremes, values far from zero for their range (where the step stops being
    coarse), with NaN and infinities placed anywhere."""
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, 3 * BLOCK + 37))
    info = torch.finfo(dtype)
    kinds = ["normal", "constant", "relu", "outliers", "wide", "tiny", "offset"]
    kind = draw(st.sampled_from(kinds))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "constant":
        x = np.full(n, draw(st.sampled_from([0.0, -0.0, 1.5, -3e3])))
    elif kind == "relu":  # zeros in runs, and positive values
        x = np.maximum(g.standard_normal(n), 0) * (g.random(n) < 0.3)
        x[: draw(st.integers(0, n))] = 0
    elif kind == "outliers":  # a narrow band and a few values far away
        x = 1 + g.standard_normal(n) * 1e-3
        x[g.integers(0, n, 3)] = draw(st.sampled_from([-1e3, 1e4]))
    elif kind == "wide":
        x = g.standard_normal(n) * float(info.max) / 8
    elif kind == "offset":  # magnitude over range near where float32's step doubles
        x = draw(st.sampled_from([1e2, 1e3, 1e4, 1e5, 1e6])) + g.standard_normal(n)
    elif kind == "tiny":
        x = g.integers(-40, 40, n) * float(info.smallest_normal) / 16
    else:
        x = g.standard_normal(n) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    t = torch.from_numpy(x).to(dtype)
    for special in draw(st.lists(st.sampled_from([math.nan, math.inf, -math.inf]), max_size=3)):
        t[draw(st.integers(0, n - 1))] = special
    return t


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=tensors(), rel=st.sampled_from([1e-1, 1e-2, 1e-3, 1e-5]))
def test_every_element_within_the_bound_from_the_slot_and_the_compact_record(x, rel):
    slot, used = compress_blocks(x, rel)
    n = x.numel()
    assert slot.dtype == torch.uint8 and slot.numel() == worst_size(n, rel, dtype=x.dtype)
    size = int(used)
    assert smallest_size(n) <= size <= slot.numel()
    y = restore_blocks(slot, x.shape, x.dtype)
    assert_within(x, y, rel)
    z = restore_blocks(slot[:size].clone(), x.shape, x.dtype)  # what compaction keeps
    assert torch.equal(bits(y), bits(z))


def bits(y: torch.Tensor) -> torch.Tensor:
    return y.view(torch.int16 if y.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_blocks_take_no_bits_and_the_worst_case_fills_the_slot(dtype):
    n = 4 * BLOCK + 5
    zeros = torch.zeros(n, dtype=dtype)
    slot, used = compress_blocks(zeros, 1e-2)
    assert int(used) == smallest_size(n)
    assert torch.equal(bits(restore_blocks(slot[: int(used)], zeros.shape, dtype)), bits(zeros))
    # every block holds the range's ends: each needs every code's width (for float32 away
    # from zero, whose rounding would otherwise let the step double)
    base = 2.0**16 if dtype == torch.float32 else 0.0
    worst = torch.full((4 * BLOCK,), base, dtype=dtype)
    worst[1::2] = base + 64
    slot, used = compress_blocks(worst, 1e-2)
    assert int(used) == slot.numel() == worst_size(worst.numel(), 1e-2)
    assert_within(worst, restore_blocks(slot, worst.shape, dtype), 1e-2)


def test_blocks_follow_their_own_range():
    # a narrow band set apart by one outlier: the fixed width pays for the outlier
    # everywhere, a block only where the outlier is
    g = torch.Generator().manual_seed(0)
    x = 1 + torch.randn(64 * BLOCK, generator=g) * 1e-2
    x[7] = 1e3
    slot, used = compress_blocks(x, 1e-3)
    assert int(used) < payload_bytes(x.numel(), code_bits(1e-3)) / 4
    assert_within(x, restore_blocks(slot[: int(used)], x.shape, x.dtype), 1e-3)


def test_meta_tensors_give_the_shapes_and_never_a_size():
    x = torch.empty(3, BLOCK + 1, device="meta", dtype=torch.bfloat16)
    slot, used = compress_blocks(x, 1e-2)
    assert slot.device.type == "meta" and slot.shape == (worst_size(x.numel(), 1e-2),)
    assert used.shape == (1,) and used.dtype == torch.int64
    assert not LaggedSize(used).ready()
    y = restore_blocks(slot, x.shape, x.dtype)
    assert y.device.type == "meta" and y.shape == x.shape and y.dtype == x.dtype


def test_a_cpu_size_is_known_at_once():
    x = torch.randn(1000)
    slot, used = compress_blocks(x, 1e-2)
    size = LaggedSize(used)
    assert size.ready() and size.value() == int(used)


@pytest.mark.parametrize(
    "x, rel, block, match",
    [
        (torch.zeros(8, dtype=torch.float64), 1e-2, BLOCK, "float64"),
        (torch.zeros(8, dtype=torch.int32), 1e-2, BLOCK, "int32"),
        (torch.zeros(8), 1e-9, BLOCK, "rel"),
        (torch.zeros(8), 1e-2, 100, "multiple of 32"),
    ],
)
def test_bad_input_is_refused(x, rel, block, match):
    with pytest.raises(ValueError, match=match):
        compress_blocks(x, rel, block)


def relu_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def test_hooks_hold_compact_records_and_fewer_bytes_than_the_fixed_width():
    model = relu_net()
    x = torch.randn(64, 64)
    x[0, 0] = 300.0  # one outlier sets every saved tensor's range: the other rows' blocks
    # (their own range far narrower) need fewer bits
    held, grads = {}, {}
    for layout in ("fixed", "blocks"):
        ac = ActivationCompression(
            "block", rel=1e-2, min_bytes=0, device_path=True, device_layout=layout, debug=True
        )
        model.zero_grad()
        with ac:
            loss = model(x).square().mean()
        held[layout] = (ac.stats.stored_bytes, ac.stats.live_bytes)
        loss.backward()  # debug: every restored tensor checked against its bound
        grads[layout] = model[0].weight.grad.clone()
    stored, live = held["blocks"]
    assert stored == live  # what the stats count is what stays held: compact records
    assert stored < held["fixed"][0] * 0.8
    cos = torch.nn.functional.cosine_similarity(
        grads["fixed"].flatten(), grads["blocks"].flatten(), dim=0
    )
    assert float(cos) > 0.99


#: the Triton kernels against the torch reference: the same used prefix, byte for byte,
#: the same restored values (NaN where it is NaN) whatever the slot holds past that
#: prefix (the kernels leave it unwritten), and every element within its tolerance
TRITON_CHECK = """
import math, torch
from tensorpress.activation_offload.device import tiles_torch as R
from tensorpress.activation_offload.device import tiles_triton as T
from tensorpress.activation_offload.device.codes_layout import STEP_MARGIN, code_bits, steps
from tensorpress.compress.bounds import tensor_range
g = torch.Generator().manual_seed(0)
# (bound, abs?, learned tolerance or None, ceiling): rel, a float16 rel whose codes would
# pass 16 bits, learned tolerances (NaN: the bound), abs (0: all exact, tiny: raw blocks)
cases = [(1e-2, False, None, 0.0), (1e-5, False, None, 0.0), (1e-2, False, 0.3, 0.04),
         (1e-2, False, math.nan, 0.04), (1e-2, True, None, 0.0), (0.0, True, None, 0.0),
         (1e-30, True, None, 0.0), (1e30, True, None, 0.0), (1e-3, True, 0.01, 0.05)]

def mixed(n, dtype):
    x = torch.randn(n, generator=g).to(dtype)
    x[::5] = 0
    x[: n // 2] = torch.relu(x[: n // 2])
    x[n // 3 :] *= 300
    if n > 10:
        x[3], x[4], x[6], x[7] = math.nan, math.inf, -math.inf, -0.0
    return x

def special(kind, n, dtype):
    if kind == "constant":
        return torch.full((n,), -3.25, dtype=dtype)
    if kind == "zeros":
        return torch.zeros(n, dtype=dtype)
    if kind == "nonfinite":  # no finite element: the range is (0, 0)
        return torch.tensor([math.nan, math.inf, -math.inf] * n, dtype=dtype)[:n]
    # far from zero next to its range: under abs the padding's zeros lie past
    # RAW_LIMIT steps from lo, and must not make the last block raw
    return (-3e4 + torch.randn(n, generator=g)).to(dtype)

def check(x, bound, absolute, e, ceiling):
    dtype, n = x.dtype, x.numel()
    ints = torch.int32 if dtype == torch.float32 else torch.int16
    x = x.to("{device}")
    learned = None if e is None else torch.tensor([e], dtype=torch.float64).to(x.device)
    nsteps = R.RAW_LIMIT if absolute else steps(bound)
    bits = R.slot_bits(dtype, None if absolute else code_bits(bound))
    a, ua = R.compress(x, bound, nsteps, bits, STEP_MARGIN, T.BLOCK, absolute,
                       learned, ceiling)
    b, ub = T.compress(x, bound, nsteps, bits, STEP_MARGIN, absolute, learned, ceiling)
    u = int(ua)
    what = (dtype, n, bound, absolute, e)
    assert u == int(ub) and b.numel() == a.numel() and torch.equal(a[:u], b[:u]), what
    junk = torch.randint(0, 256, b.shape, generator=g, dtype=torch.uint8).to(x.device)
    junk[:u] = b[:u]
    ya = R.restore(a[:u].clone(), (n,), dtype, T.BLOCK)
    for y in (R.restore(junk, (n,), dtype, T.BLOCK), T.restore(junk, (n,), dtype)):
        nan = ya.isnan() & y.isnan()  # a coded NaN's payload is not kept
        assert bool(((ya.view(ints) == y.view(ints)) | nan).all()), what
    x64, y64 = x.double(), ya.double()
    lo, hi = tensor_range(x)
    tol = R.tolerance(lo, hi, bound, absolute, learned, ceiling)
    fin, inf = x64.isfinite(), x64.isinf()
    assert torch.equal(x64.isnan(), y64.isnan()) and torch.equal(x64[inf], y64[inf]), what
    assert bool(((x64 - y64).abs()[fin] <= tol).all()), what

for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for n in (1, 2 * 256, 3 * 256 + 37):
        for case in cases:
            check(mixed(n, dtype), *case)
    for kind in ("constant", "zeros", "nonfinite", "offset"):
        for n in (3, 2 * 256 + 45):
            for case in (cases[0], cases[2], (1e-6, True, None, 0.0)):
                check(special(kind, n, dtype), *case)
"""


@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_triton_kernels_match_the_reference_under_the_interpreter():
    assert_runs_under_the_triton_interpreter(TRITON_CHECK.format(device="cpu"))


@pytest.mark.skipif(not (HAVE_TRITON and torch.cuda.is_available()), reason="needs CUDA and triton")
def test_triton_kernels_match_the_reference_on_cuda():
    # thousands of blocks at once: the look-back under real concurrency
    scope: dict = {}
    exec(compile(TRITON_CHECK.format(device="cuda"), "triton_check", "exec"), scope)
    g = torch.Generator().manual_seed(1)
    for dtype in DTYPES:
        x = torch.randn(1 << 20, generator=g).to(dtype)
        x[:: 3 * BLOCK + 1] *= 1e3  # a few blocks wide, most narrow
        for case in ((1e-2, False, None, 0.0), (1e-6, True, None, 0.0)):
            scope["check"](x[: (1 << 20) - 37], *case)


def test_the_ops_compile_as_one_graph():
    def roundtrip(x):
        slot, used = compress_blocks(x * 2, 1e-3)
        y = restore_blocks(slot, x.shape, x.dtype)
        return y + 1, slot.numel(), used

    compiled = torch.compile(roundtrip, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 300)
    y, nbytes, used = compiled(x)
    assert nbytes == worst_size(1200, 1e-3) and smallest_size(1200) <= int(used) <= nbytes
    assert_within(x * 2, y - 1, 1.01e-3)  # the + 1 rounds once more


@pytest.mark.parametrize("dtype", DTYPES)
def test_making_and_restoring_read_nothing_back(monkeypatch, dtype):
    x = torch.randn(1000).to(dtype)
    x[7], x[9] = math.nan, 0.0
    refuse_host_reads(monkeypatch)
    slot, used = compress_blocks(x, 1e-2)
    y = restore_blocks(slot, x.shape, dtype)
    monkeypatch.undo()
    assert_within(x, y, 1e-2)


def test_records_whose_sizes_lag_hold_slots_until_the_sizes_arrive(monkeypatch):
    # the device lagging behind the host, on the CPU: no size arrives until told
    model, x = relu_net(), torch.randn(64, 64)
    x[0, 0] = 300.0
    extra = torch.randn(8192, requires_grad=True)
    arrived = {"now": True}
    ready = LaggedSize.ready
    monkeypatch.setattr(LaggedSize, "ready", lambda self: arrived["now"] and ready(self))
    held, grads = {}, {}
    for lag in (False, True):
        arrived["now"] = not lag
        ac = ActivationCompression("block", rel=1e-2, min_bytes=0, device_path=True)
        model.zero_grad()
        with ac:
            loss = model(x).square().mean()
            before = ac.stats.live_bytes
            arrived["now"] = True  # the device catches up
            loss = loss + extra.sin().sum()  # this save compacts the records before it
        held[lag] = (before, ac.stats.live_bytes, ac.stats.stored_bytes)
        loss.backward()
        grads[lag] = [p.grad.clone() for p in model.parameters()]
        assert ac.stats.live_bytes == 0  # every record dropped, its bytes released
    assert held[True][0] > held[False][0]  # worst-case slots until the sizes arrive
    assert held[True][1:] == held[False][1:]  # then the compact records, counted so
    for a, b in zip(grads[False], grads[True], strict=True):
        assert torch.equal(a, b)
