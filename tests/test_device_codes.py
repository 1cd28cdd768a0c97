"""Device codes under a rel bound (activation_offload/device/codes.py): every element within its
bound after rounding to its dtype, the layout's bytes, the custom ops on meta tensors
and under torch.compile, no reads back to the host, and the Triton kernels against the
torch reference (under Triton's interpreter on the CPU, compiled on CUDA)."""

from __future__ import annotations

import importlib.util
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensorpress.activation_offload.device.codes import (
    DTYPES,
    MIN_REL,
    code_bits,
    compress_codes,
    payload_bytes,
    restore_codes,
    steps,
    supports,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAVE_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available()


def assert_within(x: torch.Tensor, y: torch.Tensor, rel: float) -> None:
    """Every finite element of ``y`` within rel of the finite range of ``x`` (compared in
    float64), NaN where x is NaN, the same infinities, zero where x is zero."""
    assert y.shape == x.shape and y.dtype == x.dtype
    x64, y64 = x.double().reshape(-1), y.double().reshape(-1)
    fin = torch.isfinite(x64)
    assert torch.equal(torch.isnan(x64), torch.isnan(y64))
    inf = torch.isinf(x64)
    assert torch.equal(x64[inf], y64[inf])
    assert bool((y64[x64 == 0] == 0).all())
    if bool(fin.any()):
        lo, hi = float(x64[fin].min()), float(x64[fin].max())
        err = (x64[fin] - y64[fin]).abs()
        assert float(err.max()) <= rel * (hi - lo), (float(err.max()), rel * (hi - lo))
        if hi == lo:
            assert torch.equal(x64[fin], y64[fin])


@st.composite
def tensors(draw):
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, 300))
    info = torch.finfo(dtype)
    kind = draw(st.sampled_from(["normal", "constant", "denormal", "huge", "tiny", "wide"]))
    g = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "constant":
        x = np.full(n, draw(st.floats(-1e4, 1e4)))
    elif kind == "denormal":  # values of the dtype's subnormal range and around it
        x = g.integers(-40, 40, n) * float(info.smallest_normal) / 16
    elif kind in ("huge", "tiny"):  # a small range far from zero
        base = 1e30 if kind == "huge" else 1e-30
        x = base * (1 + g.integers(0, 8, n) * float(info.eps))
        if dtype == torch.float16:
            x = np.clip(x, -60000, 60000)
    elif kind == "wide":
        x = g.standard_normal(n) * float(info.max) / 8
    else:
        x = g.standard_normal(n) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    t = torch.from_numpy(x).to(dtype)
    for special in draw(st.lists(st.sampled_from([math.nan, math.inf, -math.inf]), max_size=3)):
        t[draw(st.integers(0, n - 1))] = special
    return t


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors(), st.sampled_from([MIN_REL, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0, 3.0]))
def test_every_element_within_the_bound(x, rel):
    codes = compress_codes(x, rel)
    assert codes.payload.numel() == payload_bytes(x.numel(), code_bits(rel))
    assert_within(x, restore_codes(codes), rel)


@pytest.mark.parametrize("dtype", DTYPES)
def test_largest_values_stay_finite(dtype):
    big = torch.finfo(dtype).max
    x = torch.tensor([big, -big, big * 0.5, 0.0, big * 0.999], dtype=torch.float64).to(dtype)
    assert_within(x, restore_codes(compress_codes(x, 1e-2)), 1e-2)


def test_widths_follow_the_bound_alone():
    assert steps(1e-2) == 101 and code_bits(1e-2) == 7
    assert code_bits(1e-3) == 10 and code_bits(MIN_REL) == 20
    assert code_bits(0.5) == 3  # codes 0..3, then NaN, +Inf, -Inf, zero
    assert code_bits(1.0 / 3.9) == 4  # codes 0..4, then the four: 9 codes


@pytest.mark.parametrize(
    "dtype, base, unit",
    [(torch.float32, 2.0**20, 2.0**-3), (torch.bfloat16, 128.0, 1.0), (torch.float16, 1024.0, 1.0)],
)
def test_the_worst_case_needs_every_code_of_the_width(dtype, base, unit):
    """92 neighbouring values of the dtype's grid whose spacing exceeds rel times their
    range: each must come back exactly, so no width a bit narrower could hold them
    (why a payload sized before the kernel runs keeps the full width)."""
    rel, n = 1e-2, 92
    grid = base + unit * torch.arange(n, dtype=torch.float64)
    assert rel * (n - 1) * unit < unit and n > 2 ** (code_bits(rel) - 1)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    x = grid[order].to(dtype)
    assert torch.equal(x.double(), grid[order])  # every value is on the dtype's grid
    assert torch.equal(restore_codes(compress_codes(x, rel)), x)


def test_payload_is_an_lsb_first_bitstream():
    x = torch.tensor([0.0, 1.0, math.nan, math.inf, -math.inf, 0.5, 1.0, 0.01])
    codes = compress_codes(x, 0.5)  # step 0.5 * (1 - 2**-7): codes 0, 2, .., 1, 2, 0
    bits, top = code_bits(0.5), steps(0.5)
    expected = [top + 4, 2, top + 1, top + 2, top + 3, 1, 2, 0]
    stream = sum(q << (i * bits) for i, q in enumerate(expected))
    want = stream.to_bytes(payload_bytes(len(expected), bits), "little")
    assert bytes(codes.payload.numpy()) == want
    lo, hi, step = codes.scalars.tolist()
    assert (lo, hi) == (0.0, 1.0) and step == 0.5 * (1 - 2**-7)


def test_constant_and_empty_tensors():
    x = torch.full((3, 5), -2.75, dtype=torch.bfloat16)
    assert torch.equal(restore_codes(compress_codes(x, 1e-3)), x)
    e = torch.empty(0, 4)
    codes = compress_codes(e, 1e-2)
    assert codes.payload.numel() == 0 and restore_codes(codes).shape == (0, 4)
    nans = torch.full((9,), math.nan, dtype=torch.float16)
    assert torch.isnan(restore_codes(compress_codes(nans, 1e-2))).all()


@pytest.mark.parametrize(
    "dtype, rel", [(torch.float64, 1e-2), (torch.int32, 1e-2), (torch.float32, 1e-7)]
)
def test_refuses_what_it_cannot_bound(dtype, rel):
    assert not supports(dtype, rel)
    with pytest.raises(ValueError, match="device codes hold"):
        compress_codes(torch.zeros(4, dtype=dtype), rel)


def test_meta_tensors_through_the_ops():
    x = torch.empty(33, 17, dtype=torch.bfloat16, device="meta")
    codes = compress_codes(x, 1e-2)
    assert codes.payload.device.type == "meta"
    assert codes.payload.shape == (payload_bytes(33 * 17, 7),)
    assert codes.scalars.shape == (3,) and codes.scalars.dtype == torch.float64
    y = restore_codes(codes)
    assert y.shape == (33, 17) and y.dtype == torch.bfloat16 and y.device.type == "meta"


def test_compiles_as_one_graph():
    def roundtrip(x):
        payload, scalars = torch.ops.tensorpress.device_codes(x * 2, 1e-3)
        y = torch.ops.tensorpress.device_restore(payload, scalars, list(x.shape), x.dtype, 1e-3)
        return y + 1, payload.numel()

    compiled = torch.compile(roundtrip, fullgraph=True, backend="aot_eager")
    x = torch.randn(4, 50)
    y, nbytes = compiled(x)
    assert nbytes == payload_bytes(200, code_bits(1e-3))
    assert_within(x * 2, y - 1, 1.01e-3)  # the + 1 rounds once more


def _refuse(*args, **kwargs):
    raise AssertionError("read back to the host")


def refuse_host_reads(monkeypatch) -> None:
    """Make every way a tensor's values reach the host raise (until ``monkeypatch.undo()``)."""
    for name in ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, _refuse)
    monkeypatch.setattr(torch, "nonzero", _refuse)


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_host_reads(monkeypatch, dtype):
    x = torch.randn(1000).to(dtype)
    x[7] = math.nan
    refuse_host_reads(monkeypatch)
    y = restore_codes(compress_codes(x, 1e-2))
    monkeypatch.undo()
    assert_within(x, y, 1e-2)


_TRITON_CHECK = """
import math, torch
from tensorpress.activation_offload.device.codes_layout import STEP_MARGIN, code_bits, steps
from tensorpress.activation_offload.device import codes_torch as R, codes_triton as T
dev = "{device}"
g = torch.Generator().manual_seed(5)
bad = []
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for n in (1, 9, 1003, 4100):
        x = (torch.randn(n, generator=g) * 7).to(dtype)
        if n > 8:
            x[1], x[2], x[3], x[4] = math.nan, 0.0, math.inf, -math.inf
            x[8] = torch.finfo(dtype).tiny / 4
        x = x.to(dev)
        for rel in (1e-6, 1e-3, 1e-2, 0.5):
            ns, bits = steps(rel), code_bits(rel)
            p1, s1 = T.compress(x, rel, ns, bits, STEP_MARGIN)
            p2, s2 = R.compress(x, rel, ns, bits, STEP_MARGIN)
            y1 = T.restore(p2, s2, x.shape, dtype, ns, bits)
            y2 = R.restore(p2, s2, x.shape, dtype, ns, bits)
            nan = torch.isnan(y1)
            same = torch.equal(p1, p2) and torch.equal(s1, s2) and torch.equal(nan, y2.isnan())
            same = same and torch.equal(y1[~nan], y2[~nan])
            if not same:
                bad.append((str(dtype), n, rel))
print("mismatches:", bad)
assert not bad
"""


def assert_runs_under_the_triton_interpreter(script: str) -> None:
    """Run ``script`` in a fresh interpreter with ``TRITON_INTERPRET=1``; it must exit 0."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_triton_kernels_match_the_reference_under_the_interpreter():
    assert_runs_under_the_triton_interpreter(_TRITON_CHECK.format(device="cpu"))


@pytest.mark.skipif(not (HAVE_TRITON and CUDA), reason="needs CUDA and triton")
def test_triton_kernels_match_the_reference_on_cuda():
    exec(compile(_TRITON_CHECK.format(device="cuda"), "triton_check", "exec"), {})


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_path_never_synchronizes(dtype):
    x = torch.randn(1 << 20, device="cuda").to(dtype)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = restore_codes(compress_codes(x, 1e-2))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_within(x.cpu(), y.cpu(), 1e-2)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_eager_cuda_calls_write_what_the_ops_write():
    """Eager calls on CUDA run the ops' bodies without the dispatch: the same bytes."""
    from tensorpress.activation_offload.device import ops

    x = torch.randn(5000, device="cuda")
    learned = torch.full((1,), 0.05, dtype=torch.float64, device="cuda")
    calls = [
        (ops.device_codes, ops.codes, (x, 1e-2)),
        (ops.device_blocks, ops.rel_blocks, (x, 1e-2, 256)),
        (ops.device_blocks_bounded, ops.blocks, (x, 1e-3, 256, True, None, 0.0)),
        (ops.device_blocks_bounded, ops.blocks, (x, 1e-2, 256, False, learned, 1.0)),
    ]
    for op, body, args in calls:
        for a, b in zip(op(*args), ops.eager(op, body, *args), strict=True):
            assert torch.equal(a, b), op
    record, _ = ops.device_blocks(x, 1e-2, 256)
    args = (record, [5000], torch.float32, 256)
    want = ops.device_blocks_restore(*args)
    assert torch.equal(want, ops.eager(ops.device_blocks_restore, ops.blocks_restore, *args))
