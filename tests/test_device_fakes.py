"""Every ``tensorpress::`` custom op's fake implementation against its real one: the
outputs' shapes, dtypes, strides and storage offsets agree on contiguous, channels-last
and non-contiguous inputs, and ``torch.library.opcheck`` (schema, fake, autograd
registration, static and dynamic shapes under AOTAutograd) passes."""

from __future__ import annotations

import pathlib
import re

import pytest

torch = pytest.importorskip("torch")

from tensorpress.activation_offload.compiled import ops as saved_ops  # noqa: E402
from tensorpress.activation_offload.device import gelu_ops, ops, stochastic  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTED = {
    "device_codes",
    "device_codes_stochastic",
    "device_restore",
    "device_blocks",
    "device_blocks_bounded",
    "device_blocks_restore",
    "gelu_residual",
    "gelu_residual_restore",
    "saved_encode",
    "saved_decode",
}


def _inputs() -> dict:
    """Saved tensors as compiled graphs hand them over: laid out in every way."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(2, 8, 6, 5, generator=g)
    return {
        "contiguous": base,
        "channels_last": base.to(memory_format=torch.channels_last),
        "transposed": base.transpose(1, 3),
        "sliced": torch.randn(4, 30, generator=g)[:, ::3],
        "offset": torch.randn(100, generator=g)[7:67].view(6, 10),
    }


INPUTS = _inputs()
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _calls(x: torch.Tensor) -> list:
    """(op, args) for every op, the records made by the real ops from ``x``."""
    shape, dtype = list(x.shape), x.dtype
    payload, scalars = ops.device_codes(x, 1e-2)
    record, _ = ops.device_blocks(x, 1e-2, 256)
    learned = torch.tensor([0.05], dtype=torch.float64)
    y = torch.nn.functional.gelu(x)
    gelu_scalars, residual, _ = gelu_ops.gelu_residual(y, record, "none", 1e-2, False, None, 0.0)
    saved = saved_ops.saved_encode(x, 1e-2)
    return [
        (ops.device_codes, (x, 1e-2)),
        (stochastic.device_codes_stochastic, (x, 1e-2, torch.tensor(7))),
        (ops.device_restore, (payload, scalars, shape, dtype, 1e-2)),
        (ops.device_blocks, (x, 1e-2, 256)),
        (ops.device_blocks_bounded, (x, 1e-2, 256, False, learned, 5e-2)),
        (ops.device_blocks_bounded, (x, 1e-3, 256, True, None, 0.0)),
        (ops.device_blocks_restore, (record, shape, dtype, 256)),
        (gelu_ops.gelu_residual, (y, record, "tanh", 1e-2, False, learned, 5e-2)),
        (gelu_ops.gelu_residual_restore, (x, residual, gelu_scalars, "none", shape)),
        (saved_ops.saved_encode, (x, 1e-2)),
        (saved_ops.saved_decode, (saved, shape, list(x.stride()), dtype, 1e-2)),
    ]


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype, t.stride(), t.storage_offset()


def _fake_layouts(op, args) -> list:
    """The layouts of ``op``'s outputs under a fake tensor mode (strides kept)."""
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = op(*fake)
    return [_layout(t) for t in (out if isinstance(out, tuple) else (out,))]


def test_every_custom_op_is_tested():
    """A ``custom_op`` added to the package without joining ``TESTED`` fails here."""
    found = set()
    for path in ROOT.rglob("*.py"):
        if {"tests", "build", ".git"} & set(path.relative_to(ROOT).parts):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found |= set(re.findall(r'custom_op\(\s*"tensorpress::(\w+)"', text))
    assert found == TESTED


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", sorted(INPUTS))
def test_fake_outputs_are_laid_out_as_real_ones(layout, dtype):
    x = INPUTS[layout].to(dtype)
    calls = _calls(x)
    assert {op._name for op, _ in calls} == TESTED
    for op, args in calls:
        real = op(*args)
        real = [_layout(t) for t in (real if isinstance(real, tuple) else (real,))]
        assert _fake_layouts(op, args) == real, op._name


@pytest.mark.parametrize("layout", sorted(INPUTS))
def test_opcheck(layout):
    """opcheck on each op: fake vs real outputs, schema, autograd registration, and
    AOTAutograd with static and dynamic shapes."""
    for dtype in (torch.float32, torch.bfloat16):
        for op, args in _calls(INPUTS[layout].to(dtype)):
            torch.library.opcheck(op, args)


def test_restored_strides_differ_from_saved_ones_without_laid_out():
    """The ops restore contiguous tensors (their fakes say so); a channels-last saved
    tensor needs ``laid_out`` to come back with its own strides."""
    from tensorpress.activation_offload.records import laid_out

    x = INPUTS["channels_last"]
    record, _ = ops.device_blocks(x, 1e-2, 256)
    y = ops.device_blocks_restore(record, list(x.shape), x.dtype, 256)
    assert y.is_contiguous() and y.stride() != x.stride()
    z = laid_out(y, x.stride())
    assert z.stride() == x.stride() and torch.equal(z, y)
    t = INPUTS["transposed"]
    assert laid_out(t.contiguous(), t.stride()).stride() == t.stride()
    expanded = torch.randn(3, 1).expand(3, 4)  # overlapping: cannot be written, given back
    assert laid_out(expanded.contiguous(), expanded.stride()).is_contiguous()
