"""Saved tensors held as views of a rebuilt region: a linear layer's output rebuilt from
its input's record, a dense tensor's memory from its own record."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from square_loss import square_loss_grads as _grads
from tensorpress.activation_offload import ActivationCompression, Adaptive
from tensorpress.activation_offload.regions import _product_eps


class Attention(nn.Module):
    """Self-attention as a pre-norm transformer has it: q, k and v are views of one
    linear layer's output; the projection's input is attention's output, transposed."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.act = nn.Linear(dim, 4 * dim), nn.GELU()

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = self.proj(att.transpose(1, 2).reshape(b, t, d))
        return y + self.act(self.up(y)).mean(-1, keepdim=True)


def _kinds(ac, model, x) -> Counter:
    """The records of one pass, by kind (``ac.stats.records``)."""
    _grads(model, x, ac)
    return Counter(ac.stats.records)


def _passes(model, x, passes: int, bound: dict) -> tuple[Counter, dict]:
    """(records of the last pass by kind, stats rows) after ``passes`` passes under
    ``bound`` with ``debug=True`` (every restored tensor checked against its bound);
    the gradients of one more pass are checked close to the exact ones."""
    exact = _grads(model, x)
    ac = ActivationCompression(codec="block", zstd=None, debug=True, model=model, **bound)
    for _ in range(passes):
        kinds = _kinds(ac, model, x)
    got = _grads(model, x, ac)
    assert float((got - exact).norm() / exact.norm()) < 0.05
    return kinds, ac.stats.rows


@pytest.mark.parametrize(
    "bound",
    [{"abs": 0.05}, {"rel": 1e-2}, {"rel": 2e-2, "adaptive": Adaptive(update_every=1)}],
)
def test_views_of_attention_are_derived_within_their_bounds(bound):
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(8, 32, 64, requires_grad=True)
    kinds, rows = _passes(model, x, 3, bound)
    # q, k, v (three views of qkv's output), the projection's input (attention's output
    # transposed), GELU's input (up's output): no bytes of their own
    assert kinds["ViewOfRegion"] == 5
    # (a copy of up's bias: with GELU's input, the first view of up's output)
    assert rows["proj"].stored_bytes == 0 and rows["act"].stored_bytes == 4 * 256
    held = sum(r.stored_bytes for r in rows.values())
    assert held == sum(rows[n].stored_bytes for n in ("qkv", "up", "act", "(top)", "(outside)"))


def test_a_linear_output_is_rebuilt_once_for_all_its_views():
    """q, k and v come from one rebuild of qkv's output: three regions are rebuilt
    (qkv's output, attention's output, up's output) for five views."""
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(8, 32, 64, requires_grad=True)
    ac = ActivationCompression(codec="block", abs=0.05, zstd=None, debug=True, model=model)
    exact = _grads(model, x)
    _grads(model, x, ac)  # the first pass asks for the bounds the views need
    got = _grads(model, x, ac)
    assert ac.stats.records["ViewOfRegion"] == 5 and ac.stats.rebuilt == 3
    assert float((got - exact).norm() / exact.norm()) < 0.05


def test_a_view_asks_its_source_for_the_bound_it_needs():
    """The first pass holds q, k and v as they are and asks qkv's input for a tighter
    bound; the next holds that input within it and derives them."""
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(8, 32, 64, requires_grad=True)
    ac = ActivationCompression(codec="block", abs=0.05, zstd=None, debug=True, model=model)
    first = _kinds(ac, model, x)
    assert ac.stats.rows["qkv"].tolerance == 0.05
    second = _kinds(ac, model, x)
    assert first["ViewOfRegion"] < second["ViewOfRegion"] == 5
    assert ac.stats.rows["qkv"].tolerance < 0.05


def test_a_view_much_smaller_than_its_source_asks_nothing():
    """Tightening a source 16x larger than the view would cost more than the view."""
    torch.manual_seed(0)
    down = nn.Linear(256, 16)
    ac = ActivationCompression(codec="block", abs=0.05, zstd=None, model=down)
    x = torch.randn(512, 256)
    for _ in range(2):
        with ac:
            loss = down(x).sin().sum()  # sin saves down's output: 16 values a row
        loss.backward()
    assert ac.stats.rows["(top)"].tolerance == 0.05  # no tighter bound asked of it
    assert "ViewOfRegion" not in ac.stats.records


def test_weights_too_large_to_rebuild_within_the_bound_ask_nothing():
    torch.manual_seed(0)
    up = nn.Linear(64, 256)
    with torch.no_grad():
        up.weight.mul_(1e6)  # a row sum of |weight| near 1e7: 2**16x tighter is not enough
    ac = ActivationCompression(codec="block", abs=0.05, zstd=None, debug=True, model=up)
    x = torch.randn(512, 64)
    for _ in range(2):
        with ac:
            loss = up(x).sin().sum()
        loss.backward()
    assert ac.stats.rows["(top)"].tolerance == 0.05  # no tighter bound asked of it
    assert ac.stats.rows["(outside)"].stored_bytes > 0


def test_an_in_place_edit_of_the_weight_raises():
    """As autograd raises at the layer's backward, the view rebuilt from the weight
    raises (before it would use the edited weight)."""
    torch.manual_seed(0)
    up = nn.Linear(64, 256)
    x = torch.randn(512, 64, requires_grad=True)
    ac = ActivationCompression(codec="block", abs=1e-3, zstd=None, model=up)
    with ac:
        up(x).sin().sum().backward()  # asks for the bound on x that sin's input needs
    for context in (ac, contextlib.nullcontext()):
        with context:
            loss = up(x).sin().sum()
        if context is ac:  # sin's input: a view (its first view holds the bias's copy)
            assert ac.stats.rows["(outside)"].stored_bytes == up.bias.numel() * 4
        with torch.no_grad():
            up.weight.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_a_layer_that_saved_no_weight_is_rebuilt_with_a_copy():
    """Its input needs no gradient, so autograd would not notice the weight edited: the
    weight is copied (counted with the first view), and the gradients do not see the
    edit, as without hooks."""
    torch.manual_seed(0)
    up = nn.Linear(16, 256)
    x = torch.randn(4096, 16)
    ac = ActivationCompression(codec="block", abs=1e-3, zstd=None, model=up)
    with ac:
        up(x).sin().sum().backward()  # asks for the bound on x that sin's input needs
    up.zero_grad()
    with ac:
        h = up(x)
        loss = h.sin().sum()
    assert ac.stats.rows["(outside)"].stored_bytes == (16 + 1) * 256 * 4
    with torch.no_grad():
        up.weight.add_(1)
    loss.backward()
    within = 1e-3 * float(x.abs().sum(0).max()) + 1e-5  # cos moves by at most the bound
    assert float((up.weight.grad - h.detach().cos().t() @ x).abs().max()) <= within


def test_a_layer_whose_weight_is_too_large_to_copy_is_no_region():
    torch.manual_seed(0)
    up = nn.Linear(64, 256)  # weight: 1/32 of the output's values
    x = torch.randn(512, 64)
    ac = ActivationCompression(codec="block", abs=1e-3, zstd=None, model=up)
    for _ in range(2):
        with ac:
            loss = up(x).sin().sum()
        loss.backward()
    assert ac.stats.rows["(outside)"].stored_bytes > 0


def test_the_bias_is_copied():
    """Autograd saves no bias: an edit of it before backward changes no gradient."""
    torch.manual_seed(0)
    up = nn.Linear(64, 256)
    x = torch.randn(512, 64, requires_grad=True)
    ac = ActivationCompression(codec="block", abs=1e-3, zstd=None, model=up)
    with ac:
        up(x).sin().sum().backward()
    x.grad = None
    with ac:
        h = up(x)
        loss = h.sin().sum()
    assert ac.stats.rows["(outside)"].stored_bytes == up.bias.numel() * 4  # a view
    with torch.no_grad():
        up.bias.add_(1)
    loss.backward()
    # cos moves by at most the bound, the gradient by that times a column sum of |weight|
    within = 1e-3 * float(up.weight.detach().abs().sum(0).max()) + 1e-5
    assert float((x.grad - h.detach().cos() @ up.weight.detach()).abs().max()) <= within


def test_an_in_place_edit_of_a_view_still_raises():
    torch.manual_seed(0)
    up = nn.Linear(64, 256)
    ac = ActivationCompression(codec="block", abs=1.0, zstd=None, model=up)
    with ac:
        h = up(torch.randn(512, 64))
        loss = h.sin().sum()
        h.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_linear_with_a_forward_of_its_own_is_no_region():
    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    torch.manual_seed(0)
    up = Scaled(64, 256)
    ac = ActivationCompression(codec="block", abs=1.0, zstd=None, model=up)
    with ac:
        loss = up(torch.randn(512, 64)).sin().sum()
    loss.backward()
    assert ac.stats.rows["(outside)"].stored_bytes > 0


@pytest.mark.parametrize(
    "settings_",
    [{"codec": "block", "pw_rel": 1e-2}, {"codec": "quant", "bits": 4}, {"codec": None}],
)
def test_only_absolute_bounds_rebuild_linear_outputs(settings_):
    torch.manual_seed(0)
    up = nn.Linear(64, 256)
    ac = ActivationCompression(zstd=None, model=up, **settings_)
    kinds = []
    for _ in range(2):
        kinds = _kinds(ac, nn.Sequential(up, nn.GELU()), torch.randn(512, 64))
    assert "ViewOfRegion" not in kinds


def test_product_rounding_follows_the_matmul_precision():
    cpu = torch.device("cpu")
    assert _product_eps(torch.float32, cpu, conv=False) == torch.finfo(torch.float32).eps
    assert _product_eps(torch.float64, cpu, conv=True) == torch.finfo(torch.float64).eps
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # products may run in bfloat16
        assert _product_eps(torch.float32, cpu, conv=False) == 2**-7
        assert _product_eps(torch.float64, cpu, conv=False) == torch.finfo(torch.float64).eps
        torch.set_float32_matmul_precision("high")  # in TF32 (or two bfloat16s)
        assert _product_eps(torch.float32, cpu, conv=True) == 2**-10
    finally:
        torch.set_float32_matmul_precision(before)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 40),
    k=st.integers(1, 24),
    n=st.integers(2, 24),
    start=st.integers(0, 3),
    step=st.integers(1, 3),
    transpose=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    tol=st.sampled_from([1e-4, 1e-2, 0.3]),
    seed=st.integers(0, 2**16),
)
def test_any_view_of_a_linear_output_is_within_its_bound(
    rows, k, n, start, step, transpose, dtype, tol, seed
):
    """Slices with steps, transposes: each restored within its bound (debug=True checks
    every element), whether or not it is derived."""
    torch.manual_seed(seed)
    lin = nn.Linear(k, n).to(dtype)
    x = (torch.randn(rows, k, dtype=dtype) * 3).requires_grad_()
    ac = ActivationCompression(codec="block", abs=tol, zstd=None, min_bytes=0, debug=True)
    for _ in range(2):  # the second pass with the bound the first asked for
        with ac:
            h = lin(x)[:, start::step]
            v = h.t() if transpose else h
            loss = v.sin().sum() + lin(x).cos().sum()
        loss.backward()
        got = lin.weight.grad.clone()
        lin.zero_grad()
    (lin(x)[:, start::step].sin().sum() + lin(x).cos().sum()).backward()
    x.grad = None
    # sin'(v) and cos' move by at most the bound, and so does the restored x the weight's
    # gradient is made of (times the two terms' factors, at most 1 each)
    worst = 2 * tol * (float(x.detach().abs().sum(0).max()) + rows) + 1e-6
    assert float((got - lin.weight.grad).abs().max()) <= worst


@pytest.mark.parametrize(
    ("start", "step", "transpose"), [(0, 1, True), (1, 2, False), (2, 3, True)]
)
def test_strided_views_are_derived(start, step, transpose):
    torch.manual_seed(0)
    x = torch.randn(256, 32, requires_grad=True)
    ac = ActivationCompression(codec="block", abs=1e-2, zstd=None, min_bytes=0, debug=True)

    class Sliced(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(32, 96)

        def forward(self, x):
            h = self.lin(x)[:, start::step]
            return (h.t() if transpose else h).sin()

    model = Sliced()
    kinds = [_kinds(ac, model, x) for _ in range(2)]
    assert "ViewOfRegion" not in kinds[0] and "ViewOfRegion" in kinds[1]


class ConvNet(nn.Module):
    """conv -> batch norm -> ReLU, three times: 1 x 9, 16 x 9 and 32 x 9 products an
    output (MAX_TERMS: 128)."""

    def __init__(self):
        super().__init__()
        self.stages = nn.Sequential(
            *(
                nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())
                for cin, cout in ((1, 16), (16, 32), (32, 8))
            )
        )

    def forward(self, x):
        return self.stages(x).mean((2, 3))


@pytest.mark.parametrize("bound", [{"abs": 0.02}, {"rel": 1e-2}])
def test_a_cheap_convolution_is_rebuilt_within_its_bound(bound):
    torch.manual_seed(0)
    model, x = ConvNet(), torch.randn(32, 1, 32, 32)
    kinds, rows = _passes(model, x, 8, bound)
    # the first norm's input: a view of the first convolution's output (with a copy of
    # its weight: its input, the images, needs no gradient). The others sum more than
    # MAX_TERMS products an output (and their inputs are ReLUs of norms, whose bounds
    # are not tightened for views).
    assert kinds["ViewOfRegion"] == 1
    # (weight, bias, and the batch mean and invstd the norm saved)
    assert rows["stages.0.1"].stored_bytes == (16 * 9 + 16 + 2 * 16) * 4
    assert rows["stages.1.1"].stored_bytes > 0 and rows["stages.2.1"].stored_bytes > 0


def test_backward_twice_with_retain_graph_rebuilds_again():
    torch.manual_seed(0)
    model, x = Attention(), torch.randn(8, 32, 64, requires_grad=True)
    ac = ActivationCompression(codec="block", abs=0.05, zstd=None, debug=True, model=model)
    _grads(model, x, ac)  # the first pass asks for the bounds the views need
    with ac:
        loss = model(x).square().mean()
    model.zero_grad()
    loss.backward(retain_graph=True)
    once = [p.grad.clone() for p in model.parameters()]
    loss.backward()
    for g, p in zip(once, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, 2 * g)


def test_a_view_outlives_the_record_it_is_rebuilt_from():
    """Backward through one part of a graph frees that part's records; a view of one of
    them saved by the other part still restores."""
    torch.manual_seed(0)
    w = torch.randn(256, 512, requires_grad=True)
    grads = []
    for ac in (None, ActivationCompression(codec="block", abs=1e-3, zstd=None, debug=True)):
        with ac or contextlib.nullcontext():
            z = w.clone()  # (CloneBackward saves nothing)
            a = torch.sin(z)  # saves z
            b = torch.cos(z.t())  # saves z.t(): a view of the memory sin's record holds
        if ac is not None:
            assert ac.stats.rows["(outside)"].saves == 2
        (first,) = torch.autograd.grad(a.sum(), w)  # frees sin's node and its record
        (second,) = torch.autograd.grad(b.sum(), w)
        grads.append((first, second))
    for got, exact in zip(grads[1], grads[0], strict=True):
        assert float((got - exact).abs().max()) <= 2 * 2e-3 + 1e-6


class Classifier(nn.Module):
    """A layer norm, then a linear head whose logits a cross-entropy loss takes."""

    def __init__(self):
        super().__init__()
        self.norm, self.head = nn.LayerNorm(64), nn.Linear(64, 256)

    def forward(self, x):
        return self.head(self.norm(x))


def _cross_entropy_passes(ac, model, x, y, passes: int, edit=None) -> Counter:
    """The records of the last of ``passes`` passes, by kind."""
    for _ in range(passes):
        model.zero_grad()
        with ac:
            logits = model(x)
            if edit is not None:
                edit(logits)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
    return Counter(ac.stats.records)


@pytest.mark.parametrize("bound", [{"abs": 0.05}, {"rel": 1e-2}])
def test_log_probabilities_are_the_log_softmax_of_the_rebuilt_logits(bound):
    torch.manual_seed(0)
    model = Classifier()
    x, y = torch.randn(16, 64, 64, requires_grad=True), torch.randint(256, (16, 64))
    ac = ActivationCompression(codec="block", zstd=None, debug=True, model=model, **bound)
    kinds = _cross_entropy_passes(ac, model, x, y, 4)  # debug=True: each checked
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert kinds["LogSoftmaxOfRegion"] == 1  # one record for log_softmax's and nll_loss's
    # what the loss holds: the targets and its total weight as they are, and a copy of
    # the head's bias (with the first view of its output)
    assert ac.stats.rows["(outside)"].stored_bytes == y.numel() * 8 + 4 + 256 * 4
    model.zero_grad()
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    exact = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert float((got - exact).norm() / exact.norm()) < 0.05


@pytest.mark.parametrize(
    "edit",
    [
        lambda z: z.detach().mul_(2),  # edited in place, out of autograd's sight
        lambda z: z.mul_(2),  # edited in place: the loss's input is no longer the layer's
    ],
)
def test_logits_edited_before_the_loss_are_not_rebuilt(edit):
    torch.manual_seed(0)
    model = Classifier()
    x, y = torch.randn(16, 64, 64, requires_grad=True), torch.randint(256, (16, 64))
    ac = ActivationCompression(codec="block", abs=0.05, zstd=None, debug=True, model=model)
    kinds = _cross_entropy_passes(ac, model, x, y, 4, edit)
    assert "LogSoftmaxOfRegion" not in kinds


def test_log_probabilities_of_another_dtype_are_held_as_they_are():
    torch.manual_seed(0)
    model = Classifier()
    x = torch.randn(16, 64, 64, requires_grad=True)
    ac = ActivationCompression(codec="block", abs=0.05, zstd=None, debug=True, model=model)
    for _ in range(3):
        with ac:
            loss = F.log_softmax(model(x), dim=-1, dtype=torch.float64).mean()
        loss.backward()
    assert "LogSoftmaxOfRegion" not in ac.stats.records
