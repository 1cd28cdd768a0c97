"""Saved tensors laid out in memory other than in C order (a transposed residual stream,
a channels-last convolution output) are coded in their memory order: restored with
their own strides, every element within the bound, and zeros kept by the codecs that
keep them with a mask."""

from __future__ import annotations

import pytest
import torch
from tensorpress.activation_offload import ActivationCompression, Rules
from tensorpress.activation_offload.records import memory_order


class Spy(torch.autograd.Function):
    """Saves its input; backward records what autograd hands back."""

    seen: list = []

    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        Spy.seen[:] = list(ctx.saved_tensors)
        return None


def saved_and_restored(t: torch.Tensor, **kw):
    """(the ActivationCompression, what backward gets back for ``t``)."""
    ac = ActivationCompression(min_bytes=0, rules=Rules(()), **kw)
    with ac:
        out = Spy.apply(t.requires_grad_())
    out.sum().backward()
    return ac, Spy.seen[0]


def layouts():
    g = torch.Generator().manual_seed(5)
    residual = torch.randn(8, 96, 50, generator=g).transpose(1, 2)  # [8, 50, 96], dim 1 fastest
    channels_last = torch.randn(4, 24, 9, 11, generator=g).to(memory_format=torch.channels_last)
    permuted = torch.randn(6, 7, 40, 5, generator=g).permute(2, 0, 3, 1)
    return {"transposed": residual, "channels_last": channels_last, "permuted": permuted}


@pytest.mark.parametrize("name", ["transposed", "channels_last", "permuted"])
@pytest.mark.parametrize("rel", [1e-2, 1e-3])  # block codes; int8 codes (>= 64 steps)
def test_a_dense_layout_is_coded_in_memory_order_within_the_bound(name, rel):
    x = layouts()[name].detach()
    assert not x.is_contiguous() and memory_order(x) is not x
    ac, y = saved_and_restored(x.clone(memory_format=torch.preserve_format), rel=rel)
    assert ac.stats.records == {"Compressed": 1}
    assert y.shape == x.shape and y.stride() == x.stride()  # restored in place, no copy
    tol = rel * float(x.max() - x.min())
    err = (y.detach().double() - x.double()).abs()
    assert float(err.max()) <= tol  # every element
    assert float(err.max()) > 0  # (coded, not kept)
    # the very codes of its memory saved as a flat contiguous tensor: same bytes held
    flat, _ = saved_and_restored(memory_order(x).clone(), rel=rel)
    assert ac.stats.stored_bytes == flat.stats.stored_bytes < x.numel() * 4 / 3


def test_a_layout_smooth_in_memory_codes_as_smooth():
    """Values that change slowly along memory but jump in C order (a transposed ramp)
    take the bytes of a ramp: they are coded along memory."""
    ramp = torch.linspace(0, 1, 64 * 200).reshape(64, 200)  # smooth along dim 1
    x = ramp.t()  # [200, 64]; C order jumps by 200 steps of the ramp
    ac, y = saved_and_restored(x.clone(memory_format=torch.preserve_format), rel=1e-3)
    jumpy, _ = saved_and_restored(x.contiguous(), rel=1e-3)
    assert ac.stats.stored_bytes * 2 < jumpy.stats.stored_bytes
    assert float((y.detach() - x).abs().max()) <= 1e-3


def test_the_memory_order_view_covers_the_same_elements():
    for x in layouts().values():
        flat = memory_order(x)
        assert flat.dim() == 1 and flat.numel() == x.numel()
        assert flat.data_ptr() == x.data_ptr()  # a view, not a copy
        assert torch.equal(flat.sort().values, x.reshape(-1).sort().values)


def test_layouts_that_are_not_dense_are_copied_in_c_order():
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(4, 30, 3, 64, generator=g)
    q = qkv[:, :, 0]  # a slice: gaps in its span of memory
    assert not q.is_contiguous() and memory_order(q) is q
    ac, y = saved_and_restored(q.clone(memory_format=torch.preserve_format), rel=1e-2)
    assert float((y.detach() - q).abs().max()) <= 1e-2 * float(q.max() - q.min())


@pytest.mark.parametrize(("codec", "kw"), [("quant", {"bits": 2}), ("sz", {"rel": 5e-2})])
def test_zeros_survive_in_a_transposed_layout(codec, kw):
    """The zero mask is made and applied in C order; the codes are in memory order."""
    g = torch.Generator().manual_seed(4)
    r = torch.relu(torch.randn(16, 128, 40, generator=g)).transpose(1, 2)
    ac, y = saved_and_restored(r.clone(memory_format=torch.preserve_format), codec=codec, **kw)
    assert y.stride() == r.stride()
    assert torch.equal(y == 0, r == 0) if codec == "quant" else bool((y[r == 0] == 0).all())
