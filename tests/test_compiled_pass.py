"""Saved activations held as codes inside inductor's graphs
(``tensorpress.activation_offload.compiled``).

The records, of the custom ops and of the codes traced into the graphs (float32, in
memory order): the same bytes as the device codes, every element within ``rel`` of its
tensor's finite range, the sizes and strides restored (channels-last, permuted, size-1
dims), the fakes and inductor's compiled code matching the eager ops.
Training: a small pre-LayerNorm transformer LM (attention, GELU MLP, a cross-entropy
head) compiled with the pass gives gradients whose error against plain eager training is
within twice eager ``ActivationCompression``'s holding the same fixed-width codes at the
same bound (no rules; plus 1e-3), as
``tests/test_compiled_inductor.py`` holds compiled training to; the logits a loss's
softmax is recomputed from are kept; the saved bytes fall; dynamo sees no graph break,
and training several steps compiles as often as plain ``torch.compile`` does. Under a
``memory_budget`` below 1 fewer bytes are held, with gradients as close.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import shutil
import sys

import pytest

torch = pytest.importorskip("torch")

from tensorpress.activation_offload import ActivationCompression, Rules  # noqa: E402
from tensorpress.activation_offload.compiled import (  # noqa: E402
    CompiledCompression,
    compile_with_compression,
    graph_codes,  # noqa: E402
)
from tensorpress.activation_offload.compiled import ops as cops  # noqa: E402
from tensorpress.activation_offload.device import ops as device_ops  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

nn = torch.nn
F = torch.nn.functional
REL = 1e-2
V, D, T, B = 96, 64, 32, 4
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="inductor needs g++")


def _cases():
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(300, 77, generator=g) * 1e3
    special = torch.randn(5000, generator=g)
    special[::97] = float("nan")
    special[1::89] = float("inf")
    special[2::83] = -float("inf")
    special[3::7] = 0.0
    return [wide, wide.t(), special, torch.relu(torch.randn(64, 65, generator=g))]


def _assert_within_bound(x, y, rel):
    """Every finite element of ``y`` within ``rel`` of ``x``'s finite range, NaN where
    ``x`` has NaN, ``x``'s Inf exactly, its zeros zero."""
    fin = x.isfinite()
    lo, hi = x[fin].min().double(), x[fin].max().double()
    err = (y.double() - x.double()).abs()[fin]
    assert bool((err <= rel * (hi - lo)).all())  # every finite element
    assert torch.equal(y.isnan(), x.isnan()) and torch.equal(
        y[~fin & ~x.isnan()], x[~fin & ~x.isnan()]
    )
    assert bool((y[x == 0] == 0).all())


@pytest.mark.parametrize("rel", [1e-1, 1e-2, 1e-3])
def test_records_match_the_device_codes_and_keep_the_bound(rel):
    for x in _cases():
        record = cops.encode(x, rel)
        assert record.numel() == cops.record_bytes(x.numel(), rel)
        payload, scalars = device_ops.codes(x, rel)
        assert torch.equal(record[cops.HEADER :], payload)
        assert torch.equal(record[: cops.HEADER].view(torch.float64), scalars)
        y = cops.decode(record, x.shape, x.stride(), x.dtype, rel)
        assert y.shape == x.shape and y.stride() == x.stride()
        _assert_within_bound(x, y, rel)


def _layouts():
    g = torch.Generator().manual_seed(1)
    image = torch.randn(2, 5, 7, 3, generator=g) * 10 - 4
    yield image.to(memory_format=torch.channels_last)
    yield image.permute(2, 0, 3, 1)  # dense, no dim in C order
    yield torch.randn(1, 9, 1, 6, generator=g).transpose(0, 2)  # size-1 dims
    yield from _cases()


@pytest.mark.parametrize("rel", [1e-1, 1e-2, 5e-3])
def test_graph_codes_are_the_device_codes_in_memory_order_and_keep_the_bound(rel):
    for x in _layouts():
        record = graph_codes.encode(x, rel)
        assert record.numel() == graph_codes.record_bytes(x.numel(), rel)
        order = graph_codes.memory_order(x.shape, x.stride())
        payload, scalars = device_ops.codes(x.permute(order).contiguous(), rel)
        assert torch.equal(record[: cops.HEADER].view(torch.float64), scalars)
        assert torch.equal(record[cops.HEADER :][: payload.numel()], payload)
        y = graph_codes.decode(record, x.shape, x.stride(), rel)
        assert y.shape == x.shape and y.stride() == x.stride()
        _assert_within_bound(x, y, rel)


@needs_gxx
@pytest.mark.slow
def test_graph_codes_compiled_give_the_eager_bytes_shapes_and_strides():
    """What inductor compiles from the traced ops is what they compute eagerly: the same
    record, the same restored values, sizes and strides (the fake ones included)."""
    for x in list(_layouts())[:3]:
        size, stride = list(x.shape), list(x.stride())
        record = graph_codes.encode(x, REL)
        order = graph_codes.memory_order(size, stride)
        compiled = torch.compile(lambda t, o=order: graph_codes.encode(t, REL, o), fullgraph=True)
        assert torch.equal(compiled(x), record)
        restore = torch.compile(
            lambda r, s=size, st=stride, o=order: graph_codes.decode(r, s, st, REL, o),
            fullgraph=True,
        )
        y, want = restore(record), graph_codes.decode(record, size, stride, REL)
        assert y.stride() == want.stride() == x.stride() and torch.equal(y, want)
        with torch._subclasses.FakeTensorMode() as mode:
            fake = graph_codes.decode(mode.from_tensor(record), size, stride, REL)
        assert fake.shape == y.shape and fake.stride() == y.stride()


def test_bfloat16_records_restore_as_the_device_codes():
    x = torch.randn(70, 90).to(torch.bfloat16)
    record = cops.encode(x, REL)
    payload, scalars = device_ops.codes(x, REL)
    assert torch.equal(record[cops.HEADER :], payload)
    y = cops.decode(record, x.shape, x.stride(), x.dtype, REL)
    assert torch.equal(y, device_ops.restore(payload, scalars, x.shape, x.dtype, REL))


def test_the_ops_fakes_agree_with_the_real_ops():
    x = torch.randn(48, 96).t()
    torch.library.opcheck(torch.ops.tensorpress.saved_encode.default, (x, REL))
    record = cops.encode(x, REL)
    args = (record, list(x.shape), list(x.stride()), x.dtype, REL)
    torch.library.opcheck(torch.ops.tensorpress.saved_decode.default, args)


def test_bad_settings_say_what_to_do():
    with pytest.raises(ValueError, match="rel must be"):
        CompiledCompression(rel=2.0)
    with pytest.raises(ValueError, match="memory_budget must be"):
        CompiledCompression(memory_budget=0)
    with pytest.raises(ValueError, match="backend='inductor'"):
        compile_with_compression(nn.Linear(2, 2), backend="aot_eager")


@functools.cache
def _block():
    """benchmarks/compiled.py's pre-LayerNorm GPT-2 block (causal attention, GELU MLP):
    the model this test trains is the one the benchmark measures, scaled down."""
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "compiled.py"
    spec = importlib.util.spec_from_file_location("tp_benchmark_compiled", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Block


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.Sequential(_block()(D, 4), _block()(D, 4))
        self.norm, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, idx, target):
        logits = self.head(self.norm(self.blocks(self.emb(idx))))
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _grads(model, step, batches):
    out = []
    for idx in batches:
        model.zero_grad()
        step(idx)
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def _errors(grads, reference):
    return [
        [float((g - r).norm() / r.norm().clamp_min(1e-12)) for g, r in zip(gs, rs, strict=True)]
        for gs, rs in zip(grads, reference, strict=True)
    ]


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    model = LM()
    batches = [torch.randint(0, V, (B, T)) for _ in range(3)]
    plain = _grads(model, lambda i: model(i, i.roll(-1, 1)).backward(), batches)
    # the eager hooks holding the same fixed-width codes, without the rules that rebuild
    # some saved tensors from others (a compiled graph recomputes its own instead)
    # and the same smallest tensor (4096 float32 elements)
    ac = ActivationCompression(
        codec="block",
        rel=REL,
        device_path=True,
        device_layout="fixed",
        rules=Rules(()),
        min_bytes=4096 * 4,
    )

    def eager_step(i):
        with ac:
            loss = model(i, i.roll(-1, 1))
        loss.backward()

    eager = _grads(model, eager_step, batches)
    torch._dynamo.reset()
    counters.clear()
    counting = CompiledCompression(rel=None)
    compiled_plain = counting.compile(model)
    _grads(model, lambda i: compiled_plain(i, i.roll(-1, 1)).backward(), batches)
    plain_graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    counters.clear()
    cc = CompiledCompression(rel=REL)
    compiled = cc.compile(model)
    ours = _grads(model, lambda i: compiled(i, i.roll(-1, 1)).backward(), batches)
    dynamo = {
        "breaks": dict(counters["graph_break"]),
        "graphs": counters["stats"]["unique_graphs"],
        "plain_graphs": plain_graphs,
    }
    return {"plain": plain, "eager": eager, "ours": ours, "cc": cc, "counting": counting} | {
        "dynamo": dynamo
    }


@needs_gxx
@pytest.mark.slow
def test_compiled_gradients_within_the_bound_relation(trained):
    ours = _errors(trained["ours"], trained["plain"])
    eager = _errors(trained["eager"], trained["plain"])
    for step_ours, step_eager in zip(ours, eager, strict=True):
        for e_ours, e_eager in zip(step_ours, step_eager, strict=True):
            assert e_ours <= 2 * e_eager + 1e-3
    assert max(max(s) for s in ours) > 0  # the codes changed the gradients: they were used
    across = _errors(trained["ours"], trained["eager"])
    assert max(max(s) for s in across) <= 2 * max(max(s) for s in eager) + 1e-3


@needs_gxx
@pytest.mark.slow
def test_the_pass_holds_fewer_bytes_and_keeps_the_logits(trained):
    (graph,) = trained["cc"].saved.graphs  # one forward graph for the three steps
    (plain,) = trained["counting"].saved.graphs
    assert graph["activations"] == plain["activations"] == plain["held"]
    assert graph["encoded"] >= 8 and graph["held"] * 4 < graph["activations"]
    assert graph["recomputed"] >= 2  # each block's GELU output, from its restored input
    logits = [t for t in graph["tensors"] if t[2] == B * T * V * 4]
    assert logits and all(held == nbytes for _, _, nbytes, held in logits)


@needs_gxx
@pytest.mark.slow
def test_no_graph_breaks_and_no_more_compiles_than_plain(trained):
    dynamo = trained["dynamo"]
    assert dynamo["breaks"] == {} and dynamo["graphs"] == dynamo["plain_graphs"] == 1
    # three training steps: each partitioner saw one joint graph
    assert len(trained["cc"].saved.graphs) == len(trained["counting"].saved.graphs) == 1
    explained = torch._dynamo.explain(LM())(*[torch.randint(0, V, (B, T))] * 2)
    assert explained.graph_break_count == 0  # the model as dynamo sees it, pass or not


@needs_gxx
@pytest.mark.slow
def test_a_memory_budget_recomputes_more_and_keeps_the_bound_relation():
    """Under ``memory_budget`` the partitioner recomputes cheap producers from fewer saved
    tensors, which the codes hold: fewer bytes than at the full budget, and gradients as
    close to plain training (held to eager codes by the tests above at the full budget)."""
    torch.manual_seed(0)
    model = LM()
    batches = [torch.randint(0, V, (B, T)) for _ in range(2)]
    plain = _grads(model, lambda i: model(i, i.roll(-1, 1)).backward(), batches)
    errors, graphs = {}, {}
    for budget in (1.0, 0.5):
        torch._dynamo.reset()
        cc = CompiledCompression(rel=REL, memory_budget=budget)
        compiled = cc.compile(model)
        grads = _grads(model, lambda i, c=compiled: c(i, i.roll(-1, 1)).backward(), batches)
        errors[budget] = max(max(s) for s in _errors(grads, plain))
        (graphs[budget],) = cc.saved.graphs
    assert 0 < errors[0.5] <= 2 * errors[1.0] + 1e-3, errors
    assert graphs[0.5]["encoded"] >= 4 and graphs[0.5]["held"] < graphs[1.0]["held"]
