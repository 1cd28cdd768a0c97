"""The GELU residual's kernels (activation_offload/device/gelu_*.py, gelu_ops.py):
the Triton kernels write the torch reference's bytes and restore its values bit for bit
under Triton's interpreter (float16, bfloat16, float32, odd sizes, NaN and infinities,
both approximations, rel, abs and learned bounds); the prediction within 2e-8 of GELU;
the ops on meta tensors, under torch.compile(fullgraph=True), and with no host sync on
CUDA. Every element's bound is test_device_gelu.py's."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from tensorpress.activation_offload.device import gelu_torch as reference
from tensorpress.activation_offload.device.gelu_ops import gelu_residual, gelu_residual_restore
from tensorpress.activation_offload.device.tiles import compress_blocks, restore_blocks, worst_size
from test_device_codes import assert_runs_under_the_triton_interpreter
from test_device_gelu import assert_within_tol, bound_of

HAVE_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available()

#: the Triton kernels against the torch reference: the same scalars, the same used prefix
#: byte for byte, the same restored bits (NaN where it is NaN)
TRITON_CHECK = """
import math, torch
import torch.nn.functional as F
from tensorpress.activation_offload.device import tiles_torch as B
from tensorpress.activation_offload.device import gelu_torch as R
from tensorpress.activation_offload.device import gelu_triton as T
from tensorpress.activation_offload.device.codes_layout import STEP_MARGIN, code_bits, steps
g = torch.Generator().manual_seed(0)
dev = "{device}"
# (dtype, n, approximate, output bound, abs?, learned tolerance or None, ceiling, kind)
cases = [
    (torch.float32, 1, "none", 1e-2, False, None, 0.0, "gelu"),
    (torch.float32, 805, "none", 1e-3, False, 0.05, 0.05, "gelu"),
    (torch.float32, 301, "tanh", 1e-2, True, None, 0.0, "other"),
    (torch.float32, 300, "none", 1e-2, False, 0.1, 0.5, "constant"),
    (torch.float32, 300, "tanh", 1e-2, False, None, 0.0, "nonfinite"),
    (torch.float16, 301, "tanh", 1e-2, False, None, 0.0, "gelu"),
    (torch.float16, 301, "none", 1e-3, True, None, 0.0, "gelu"),
    (torch.bfloat16, 805, "none", 1e-2, False, math.nan, 0.04, "gelu"),
    (torch.bfloat16, 301, "tanh", 1e-5, False, None, 0.0, "other"),
]
for dtype, n, approx, bound, absolute, e, ceiling, kind in cases:
    ints = torch.int32 if dtype == torch.float32 else torch.int16
    x = (torch.randn(n, generator=g) * 3).to(dtype)
    x[n // 2 :] *= 100
    x[::7] = 0  # y and the prediction both 0: a residual of exactly 0
    if n > 10:
        x[3], x[4], x[6], x[7] = math.nan, math.inf, -math.inf, -0.0
    y = F.gelu(x, approximate=approx)
    if kind == "other":
        y = torch.flip(x, (0,)) * 3
    elif kind == "constant":
        y = torch.full_like(x, 2.5)
    elif kind == "nonfinite":
        y = torch.full_like(x, math.nan)
        y[::3] = math.inf
    elif n > 10:
        y[9], y[11] = math.nan, -math.inf
    x, y = x.to(dev), y.to(dev)
    bits = B.slot_bits(dtype, code_bits(1e-2))
    src, _ = B.compress(x, 1e-2, steps(1e-2), bits, STEP_MARGIN, 256)
    learned = None if e is None else torch.tensor([e], dtype=torch.float64, device=dev)
    s1, r1, u1 = R.pack(y, src, approx, bound, absolute, learned, ceiling)
    s2, r2, u2 = T.pack(y, src, approx, bound, absolute, learned, ceiling)
    u = int(u1)
    case = (dtype, n, approx, bound, absolute, e, kind)
    assert u == int(u2) and torch.equal(s1, s2), case
    assert torch.equal(r1[:u], r2[:u]), case
    xr = B.restore(src, (n,), dtype, 256)
    z1 = R.restore(xr, r1[:u].clone(), s1, approx, (n,), dtype)
    z2 = T.restore(xr, r1[:u].clone(), s1, approx, (n,), dtype)
    same = (z1.view(ints) == z2.view(ints)) | (z1.isnan() & z2.isnan())
    assert bool(same.all()), case
"""


@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed")
def test_triton_kernels_match_the_reference_under_the_interpreter():
    assert_runs_under_the_triton_interpreter(TRITON_CHECK.format(device="cpu"))


@pytest.mark.skipif(not (HAVE_TRITON and CUDA), reason="needs CUDA and triton")
def test_triton_kernels_match_the_reference_on_cuda():
    exec(compile(TRITON_CHECK.format(device="cuda"), "triton_check", "exec"), {})


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_the_prediction_is_gelu_within_2e_8(approximate):
    x = torch.cat([torch.linspace(-30, 30, 20001, dtype=torch.float64), torch.tensor([1e30])])
    g = reference.gelu(x, approximate)
    err = (g - F.gelu(x, approximate=approximate)).abs()
    assert float(err.max()) <= 2e-8
    special = reference.gelu(torch.tensor([math.nan, math.inf], dtype=torch.float64), "none")
    assert math.isnan(float(special[0])) and float(special[1]) == math.inf


def held(y: torch.Tensor, x: torch.Tensor, approximate: str, rel: float):
    """The input's block record, then the output's residual (scalars, record, used)."""
    src, _ = compress_blocks(x, 1e-2)
    return src, gelu_residual(y, src, approximate, rel, False, None, 0.0)


def test_the_ops_on_meta_tensors_give_the_slot_and_the_shapes():
    x = torch.empty(5, 301, dtype=torch.bfloat16, device="meta")
    src, (scalars, record, used) = held(torch.empty_like(x), x, "tanh", 1e-2)
    assert src.numel() == worst_size(1505, 1e-2, dtype=torch.bfloat16)
    assert record.shape == (worst_size(1505, 1e-2 / 5),) and record.device.type == "meta"
    assert scalars.shape == (3,) and used.shape == (1,)
    y = gelu_residual_restore(x, record, scalars, "tanh", [1505])
    assert y.shape == (1505,) and y.dtype == torch.bfloat16 and y.device.type == "meta"


def test_pack_and_restore_compile_as_one_graph():
    def roundtrip(x):
        h = x * 2
        y = F.gelu(h)
        src, (scalars, record, used) = held(y, h, "none", 1e-3)
        hr = restore_blocks(src, h.shape, h.dtype)
        return gelu_residual_restore(hr, record, scalars, "none", list(y.shape)), used, y

    compiled = torch.compile(roundtrip, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 333)
    z, used, y = compiled(x)
    eager, eager_used, _ = roundtrip(x)
    assert int(used) == int(eager_used) and torch.equal(z, eager)
    assert_within_tol(y, z, bound_of(y, rel=1e-3))


def test_an_unknown_approximation_is_refused():
    x = torch.randn(300)
    with pytest.raises(ValueError, match="approximate"):
        held(F.gelu(x), x, "erf", 1e-2)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_pack_and_restore_never_synchronize(dtype):
    x = (torch.randn(1 << 20, device="cuda") * 2).to(dtype)
    y = F.gelu(x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        src, (scalars, record, _) = held(y, x, "none", 1e-2)
        z = gelu_residual_restore(restore_blocks(src, x.shape, dtype), record, scalars, "none",
                                  list(x.shape))  # fmt: skip
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_within_tol(y.cpu(), z.cpu(), bound_of(y.cpu(), rel=1e-2))
