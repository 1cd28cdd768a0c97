"""Outputs held as functions of other records: GELU of its input, ReLU of a batch norm of
its input."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from square_loss import square_loss_grads as _grads
from tensorpress.activation_offload import RULES, ActivationCompression, Adaptive, Rules
from tensorpress.activation_offload.derived import (
    GELU_LIPSCHITZ,
    _positive_bits,
    _relu_of_affine,
)
from tensorpress.activation_offload.records import (
    _pack_bits_ops,
    _unpack_bits_ops,
    pack_bits,
    unpack_bits,
)


class MLP(nn.Module):
    def __init__(self, approximate: str = "none", width: int = 256):
        super().__init__()
        self.up = nn.Linear(64, width)
        self.act = nn.GELU(approximate=approximate)
        self.down = nn.Linear(width, 64)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(512, 64), (8, 64, 64)])  # 3-d: the linear layer reshapes
@pytest.mark.parametrize(
    "bound",
    [{"abs": 0.05}, {"rel": 1e-2}, {"rel": 2e-2, "adaptive": Adaptive(update_every=1)}],
)
def test_gelu_output_is_derived_within_its_bound(approximate, shape, bound):
    torch.manual_seed(0)
    model, x = MLP(approximate), 3 * torch.randn(*shape)
    exact = _grads(model, x)
    # "up" keeps its input: GELU's input is compressed, not rebuilt as "up" of its input
    ac = ActivationCompression(
        codec="block", zstd=None, debug=True, model=model, exclude=["up"], **bound
    )
    for _ in range(2):  # debug=True: every restored tensor is checked against its bound
        got = _grads(model, x, ac)
    rows = ac.stats.rows
    assert rows["down"].saves == 1 and rows["down"].stored_bytes == 0
    assert rows["act"].stored_bytes > 0
    # the input is held tightly enough for the output's bound
    assert GELU_LIPSCHITZ * rows["act"].tolerance <= rows["down"].tolerance
    assert float((got - exact).norm() / exact.norm()) < 0.05


def test_rules_are_opt_in_and_the_core_compresses_alone():
    """With ``Rules(())`` no output is derived: GELU's output is compressed like any
    other and restored within its bound; with the gelu rule alone it is derived."""
    torch.manual_seed(0)
    model, x = MLP(), 3 * torch.randn(512, 64)
    exact = _grads(model, x)
    for rules, derived in ((Rules(()), False), (Rules(("gelu",)), True)):
        ac = ActivationCompression(
            codec="block", rel=1e-2, zstd=None, debug=True, model=model, rules=rules
        )
        got = _grads(model, x, ac)
        assert (ac.stats.rows["down"].stored_bytes == 0) == derived
        assert float((got - exact).norm() / exact.norm()) < 0.05
        state = ac.state_dict()
        assert state["config"]["rules"] == list(rules.enabled)


def test_a_rule_not_tested_with_this_torch_is_left_out_with_a_warning():
    with pytest.warns(RuntimeWarning, match="tested with torch"):
        assert Rules().active("1.0.0") == []
    assert [r.name for r in Rules(untested="use").active("1.0.0")] == list(RULES)
    assert Rules(untested="skip").active("1.0.0") == []
    assert [r.name for r in Rules(("regions", "gelu")).active()] == ["gelu", "regions"]
    for rule in RULES.values():  # each rule names its autograd nodes and tested torches
        assert rule.nodes and all(n.endswith("Backward0") for n in rule.nodes)
        assert rule.torch_versions
    with pytest.raises(ValueError, match="unknown rules"):
        Rules(("softmax",))
    with pytest.raises(TypeError, match="tuple of rule names"):
        Rules("gelu")


def test_a_gelu_input_is_restored_once():
    """The output's restore keeps the restored input for GELU's own backward: every codec
    record is decoded once (``stats.decoded``), and each restored tensor keeps its bound
    (``debug=True``)."""
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(512, 64)
    exact = _grads(model, x)
    ac = ActivationCompression(
        codec="block", rel=1e-2, zstd=None, min_bytes=0, debug=True, model=model
    )
    got = _grads(model, x, ac)
    assert ac.stats.rows["down"].stored_bytes == 0 and ac.stats.records["GeluOfInput"] == 1
    assert ac.stats.records["Compressed"] >= 2  # GELU's input and up's
    assert ac.stats.decoded == ac.stats.records["Compressed"]
    assert float((got - exact).norm() / exact.norm()) < 0.05


def test_functional_gelu_falls_back_to_compressing_its_output():
    """Only an nn.GELU's input is held tightly enough; F.gelu's output is compressed."""

    class Functional(MLP):
        def forward(self, x):
            return self.down(F.gelu(self.up(x)))

    torch.manual_seed(0)
    model, x = Functional(), 3 * torch.randn(512, 64)
    ac = ActivationCompression(codec="block", rel=1e-2, debug=True, model=model)
    _grads(model, x, ac)
    assert ac.stats.rows["down"].stored_bytes > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_outputs_are_compressed(dtype):
    torch.manual_seed(0)
    model, x = MLP().to(dtype), torch.randn(512, 64, dtype=dtype)
    ac = ActivationCompression(codec="block", rel=1e-2, debug=True, model=model)
    _grads(model, x, ac)
    assert ac.stats.rows["down"].stored_bytes > 0


def test_in_place_edit_of_a_derived_output_still_raises():
    torch.manual_seed(0)
    up, down = nn.Linear(64, 256), nn.Linear(256, 64)
    act = nn.GELU()
    ac = ActivationCompression(codec="block", rel=1e-2, model=nn.ModuleList([up, act, down]))
    with ac:
        h = act(up(torch.randn(512, 64)))
        out = down(h)
        h.mul_(2)  # after the linear layer saved it
    assert ac.stats.rows["2"].stored_bytes == 0  # `down`: held as GELU of the input
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_a_tighter_second_save_holds_the_output_itself():
    """Saved again under a bound GELU of the input cannot keep, the output is compressed
    and both savers get that record."""

    class Twice(MLP):
        def __init__(self):
            super().__init__()
            self.square = nn.Identity()

        def forward(self, x):
            h = self.act(self.up(x))
            # h saved by `down` and by the product
            return self.down(h) + (self.square(h) * h).mean(1, keepdim=True)

    class TightForTheProduct(ActivationCompression):
        # no public setting gives one saver of a tensor a tighter bound than another's,
        # so the bound's one hook is overridden: GELU's output, saved by the product
        def _tolerance(self, t, module, name, span=None):
            tol = super()._tolerance(t, module, name, span)
            return tol / 10 if outputs and t is outputs[-1] and name == "(top)" else tol

    torch.manual_seed(0)
    model, x = Twice(), 3 * torch.randn(512, 64)
    outputs = []  # GELU's output, by a public forward hook
    model.act.register_forward_hook(lambda m, args, out: outputs.append(out))
    ac = TightForTheProduct(codec="block", rel=1e-2, debug=True, model=model)
    _grads(model, x, ac)  # debug=True: both savers' restored tensors are checked
    assert ac.stats.records["GeluOfInput"] == 1  # the first save was derived
    assert ac.stats.rows["(top)"].stored_bytes > 0  # the second one holds it


# -- a ReLU's output after a batch norm ---------------------------------------------------


class ConvNet(nn.Module):
    """conv -> batch norm -> ReLU -> conv: the ReLU's output is saved by the ReLU and by
    the second convolution."""

    def __init__(self, relu: str = "inplace", channels: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=relu == "inplace")
        self.functional = relu == "functional"
        self.conv2 = nn.Conv2d(channels, 4, 3, padding=1)

    def forward(self, x):
        h = self.bn(self.conv1(x))
        h = F.relu(h) if self.functional else self.relu(h)
        return self.conv2(h)


def _relu_bytes(model: ConvNet, x: torch.Tensor) -> int:
    """Bytes a derived ReLU output holds: its 1-bit mask and two values per channel."""
    n = x.shape[0] * model.bn.num_features * x.shape[2] * x.shape[3]
    return -(-n // 8) + 2 * model.bn.num_features * 4


@pytest.mark.parametrize("relu", ["inplace", "module", "functional"])
@pytest.mark.parametrize(
    "bound",
    [{"abs": 0.05}, {"rel": 1e-2}, {"rel": 2e-2, "adaptive": Adaptive(update_every=1)}],
)
def test_relu_of_batch_norm_is_derived_within_its_bound(relu, bound):
    torch.manual_seed(0)
    model, x = ConvNet(relu), torch.randn(16, 3, 16, 16)
    exact = _grads(model, x)
    ac = ActivationCompression(
        codec="block", zstd=None, debug=True, min_bytes=0, model=model, **bound
    )
    for _ in range(3):  # the first pass learns the bound the norm's input needs
        got = _grads(model, x, ac)
    name = "(top)" if relu == "functional" else "relu"
    rows = ac.stats.rows
    assert rows[name].saves == 1 and rows[name].stored_bytes == _relu_bytes(model, x)
    assert rows["conv2"].saves == 1 and rows["conv2"].stored_bytes == 0  # the same tensor
    assert float((got - exact).norm() / exact.norm()) < 0.05


def test_a_derived_relu_output_is_positive_exactly_where_it_was():
    torch.manual_seed(0)
    model, x = ConvNet("module"), torch.randn(16, 3, 16, 16)
    ac = ActivationCompression(codec="block", abs=0.5, zstd=None, model=model)
    for _ in range(2):  # the first pass learns the bound the norm's input needs
        with ac:
            y = model.relu(model.bn(model.conv1(x)))
            restored = y.grad_fn._saved_result  # unpacked through the hooks
    assert ac.stats.rows["relu"].stored_bytes == _relu_bytes(model, x)
    assert torch.equal(restored > 0, y > 0) and torch.equal(restored == 0, y == 0)
    assert 0 < float((restored - y).detach().abs().max()) <= 0.5


def test_a_large_batch_norm_weight_tightens_its_input():
    """|alpha| = invstd * |weight| scales the input's error; the input is held within
    the output's bound over max |alpha| (the debug check holds the output to it)."""
    torch.manual_seed(0)
    model, x = ConvNet("module"), torch.randn(16, 3, 16, 16)
    with torch.no_grad():
        model.bn.weight.mul_(torch.linspace(0.1, 40.0, 8))
    ac = ActivationCompression(codec="block", abs=0.05, zstd=None, debug=True, model=model)
    for _ in range(2):
        _grads(model, x, ac)
    rows = ac.stats.rows
    assert rows["relu"].stored_bytes == _relu_bytes(model, x)
    assert rows["bn"].tolerance < rows["relu"].tolerance / 10


@pytest.mark.parametrize("case", ["eval", "bfloat16", "gelu after the norm"])
def test_relu_outputs_the_norm_cannot_give_are_compressed(case):
    torch.manual_seed(0)
    model, x = ConvNet("module"), torch.randn(16, 3, 16, 16)
    if case == "eval":
        model.eval()
    elif case == "bfloat16":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    else:
        model.relu = nn.GELU()
    ac = ActivationCompression(codec="block", rel=1e-2, zstd=None, debug=True, model=model)
    for _ in range(2):
        _grads(model, x, ac)
    held = ac.stats.rows["relu"].stored_bytes
    assert held > 0 and held != _relu_bytes(model, x)


def test_in_place_edit_of_the_norm_input_still_raises():
    torch.manual_seed(0)
    model, x = ConvNet("module"), torch.randn(16, 3, 16, 16)
    ac = ActivationCompression(codec="block", rel=1e-2, zstd=None, model=model)
    for step in range(2):
        with ac:
            h = model.conv1(x)
            out = model.conv2(model.relu(model.bn(h)))
            if step:
                h.mul_(2)  # after the batch norm saved it
        if step:
            assert ac.stats.rows["relu"].stored_bytes == _relu_bytes(model, x)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.sum().backward()
        else:
            out.sum().backward()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 100), seed=st.integers(0, 2**16))
def test_bits_pack_the_same_on_the_host_and_in_torch_ops(n, seed):
    """The host path (numpy) and the device path (torch ops) of the 1-bit masks give the
    same bytes and the same bools back."""
    b = torch.rand(n, generator=torch.Generator().manual_seed(seed)) < 0.5
    packed = pack_bits(b.reshape(1, n, 1))
    assert torch.equal(packed, _pack_bits_ops(b)) and packed.numel() == -(-n // 8)
    assert torch.equal(unpack_bits(packed, (n, 1)).reshape(-1), b)
    assert torch.equal(_unpack_bits_ops(packed, n), b)


_SPECIALS = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, -1e-40, 1e30]


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 100),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_the_positive_bits_kernel_packs_as_pack_bits(n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g, dtype=dtype)
    picks = torch.randint(0, len(_SPECIALS), (n,), generator=g)
    special = torch.rand(n, generator=g) < 0.3
    t[special] = torch.tensor(_SPECIALS, dtype=dtype)[picks[special]]
    assert torch.equal(_positive_bits(t.reshape(1, n, 1)), pack_bits(t > 0))


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from([(2, 3, 8), (1, 1, 16), (3, 2, 4, 6), (0, 4, 8)]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_the_relu_restore_kernel_matches_torch_ops(shape, dtype, seed):
    """ReLU of ``x * alpha + beta`` where the mask is set, else 0: the kernel's values are
    the torch ops' to a unit in the last place of the terms (one rounding fused or not),
    NaN stays NaN, and zeros and positives sit where the mask says."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=dtype)
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)[
        : x.numel()
    ]
    view = (1, shape[1]) + (1,) * (len(shape) - 2)
    alpha = (torch.rand(view, generator=g, dtype=dtype) + 0.1) * 3
    beta = torch.randn(view, generator=g, dtype=dtype)
    mask = pack_bits(torch.rand(shape, generator=g) < 0.6)
    want = torch.addcmul(beta, x, alpha).clamp_min_(torch.finfo(dtype).tiny)
    want.mul_(unpack_bits(mask, shape).view(torch.uint8))
    got = _relu_of_affine(x, alpha, beta, mask, math.prod(shape[2:]))
    assert got.shape == want.shape and got.dtype == dtype
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got == 0, want == 0) and torch.equal(got > 0, want > 0)
    fin = want.isfinite()
    assert torch.equal(got[~fin & ~want.isnan()], want[~fin & ~want.isnan()])
    terms = (x * alpha).abs() + beta.abs()
    ulp = torch.finfo(dtype).eps * terms.expand(shape)[fin]
    assert bool(((got[fin] - want[fin]).abs() <= ulp).all())


def test_relu_of_batch_norm_with_the_norm_input_in_a_store(tmp_path):
    """The norm's input offloaded to files: the ReLU output comes back from it, within
    its bound, and the gradients match those held in memory."""
    from tensorpress.activation_offload import TieredStore

    torch.manual_seed(0)
    model, x = ConvNet("module"), torch.randn(16, 3, 16, 16)
    in_memory = ActivationCompression(codec="block", rel=1e-2, zstd=None, model=model)
    with TieredStore(0, nvme_dir=tmp_path) as store:
        offloaded = ActivationCompression(
            codec="block", rel=1e-2, zstd=None, debug=True, offload=store, model=model
        )
        for _ in range(2):
            want, got = _grads(model, x, in_memory), _grads(model, x, offloaded)
        assert store.stats.spilled_bytes > 0
    assert offloaded.stats.rows["relu"].stored_bytes == _relu_bytes(model, x)
    assert torch.equal(got, want)


@pytest.mark.parametrize("shape", [(256, 32), (64, 32, 8)])
@pytest.mark.parametrize("affine", [True, False])
def test_relu_of_batch_norm_1d_and_without_affine(shape, affine):
    """BatchNorm1d over (N, C) and (N, C, L), with and without weight and bias."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(shape[-1], shape[-1]),
        nn.BatchNorm1d(32, affine=affine),
        nn.ReLU(),
        nn.Linear(shape[-1], 4),
    )
    x = torch.randn(*shape)
    ac = ActivationCompression(
        codec="block", rel=1e-2, zstd=None, debug=True, min_bytes=0, model=model
    )
    # (the loss's input, the last layer's output, asks the ReLU's output for a slightly
    # tighter bound on the first pass, which the norm's input meets from the third)
    for _ in range(3):
        _grads(model, x, ac)
    assert ac.stats.rows["2"].stored_bytes == -(-x.numel() // 8) + 2 * 32 * 4


# -- a layer norm's output ----------------------------------------------------------------


class PreNorm(nn.Module):
    """x -> layer norm -> linear (which saves the norm's output, flattened to 2-d)."""

    def __init__(self, width: int = 64, affine: bool = True):
        super().__init__()
        self.lift = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width, elementwise_affine=affine)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        h = self.lift(x)
        return h + self.proj(self.norm(h))


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(512, 64), (8, 64, 64)])
@pytest.mark.parametrize(
    "bound",
    [{"abs": 0.05}, {"rel": 1e-2}, {"rel": 2e-2, "adaptive": Adaptive(update_every=1)}],
)
def test_layer_norm_output_is_derived_within_its_bound(affine, shape, bound):
    torch.manual_seed(0)
    model, x = PreNorm(affine=affine), 3 * torch.randn(*shape) + 1
    if affine:
        with torch.no_grad():
            model.norm.weight.uniform_(0.5, 4.0)
            model.norm.bias.uniform_(-1.0, 1.0)
    exact = _grads(model, x)
    ac = ActivationCompression(
        codec="block", zstd=None, debug=True, min_bytes=0, model=model, **bound
    )
    for _ in range(3):  # the first pass learns the bound the norm's input needs
        got = _grads(model, x, ac)
    rows = ac.stats.rows
    assert rows["proj"].saves == 1 and rows["proj"].stored_bytes == (2 * 64 * 4 if affine else 0)
    assert rows["norm"].stored_bytes > 0
    assert float((got - exact).norm() / exact.norm()) < 0.05


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_layer_norm_outputs_are_compressed(dtype):
    torch.manual_seed(0)
    model, x = PreNorm().to(dtype), torch.randn(512, 64, dtype=dtype)
    ac = ActivationCompression(codec="block", rel=1e-2, debug=True, min_bytes=0, model=model)
    for _ in range(2):
        _grads(model, x, ac)
    assert ac.stats.rows["proj"].stored_bytes > 2 * 64 * 4


def test_in_place_edit_of_the_layer_norm_input_still_raises():
    torch.manual_seed(0)
    model, x = PreNorm(), torch.randn(512, 64)
    ac = ActivationCompression(codec="block", rel=1e-2, min_bytes=0, model=model)
    for step in range(2):
        with ac:
            h = model.lift(x)
            out = model.proj(model.norm(h))
            if step:
                h.mul_(2)  # after the layer norm saved it
        if step:
            assert ac.stats.rows["proj"].stored_bytes == 2 * 64 * 4
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                out.sum().backward()
        else:
            out.sum().backward()


def test_a_layer_norm_with_a_forward_of_its_own_is_not_derived():
    """A LayerNorm subclass that normalizes with other weights than its parameters:
    its output is compressed, not derived from the parameters."""

    class Doubled(nn.LayerNorm):
        def forward(self, x):
            return F.layer_norm(x, self.normalized_shape, 2 * self.weight, self.bias, self.eps)

    torch.manual_seed(0)
    model, x = PreNorm(), torch.randn(512, 64)
    model.norm = Doubled(64)
    ac = ActivationCompression(codec="block", rel=1e-2, debug=True, min_bytes=0, model=model)
    for _ in range(2):
        _grads(model, x, ac)
    assert ac.stats.rows["proj"].stored_bytes > 2 * 64 * 4
