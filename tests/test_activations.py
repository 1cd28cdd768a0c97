"""Activation compression: exact when asked, within the bound when compressed, and
autograd's own guarantees (in-place checks, parameters untouched) intact."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from dist_workers import end_worker
from tensorpress.activation_offload import ActivationCompression, Adaptive, wrap
from tensorpress.activation_offload.identity import ParameterStorages
from tensorpress.activation_offload.records import Kept


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Mixed(nn.Module):
    """conv, batch norm, ReLU (in place), GELU, attention, layer norm, dropout."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.proj = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.attn = Attention(32, 4)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        h = self.relu(self.bn(self.conv(x)))  # [b, 16, 8, 8]
        h = h.flatten(2).transpose(1, 2)  # [b, 64, 16]
        h = F.gelu(self.proj(h))
        h = h + self.attn(self.norm(h))
        h.mul_(0.5)  # an in-place op on a tensor autograd does not need
        return self.head(self.drop(h)).mean(1)


def batch(seed=0, n=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


def grads(model, ctx, x, y, seed=1):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # dropout
    with ctx:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def relative_error(a: dict, b: dict) -> float:
    num = sum(float((a[k] - b[k]).pow(2).sum()) for k in a)
    return math.sqrt(num / sum(float(a[k].pow(2).sum()) for k in a))


def test_exact_setting_gives_bit_identical_gradients():
    torch.manual_seed(0)
    model = Mixed()
    x, y = batch()
    want = grads(model, contextlib.nullcontext(), x, y)
    ac = ActivationCompression(codec=None)
    got = grads(model, ac, x, y)
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    assert ac.stats.saved_bytes > 0 and ac.stats.ratio == pytest.approx(1.0, rel=0.5)
    assert ac.stats.live_bytes == 0  # all released after backward


@pytest.mark.parametrize(
    "kw",
    [
        {"codec": "block", "rel": 1e-2},
        {"codec": "block", "abs": 1e-3},
        {"codec": "block", "pw_rel": 1e-2},
        {"codec": "sz", "rel": 1e-2},
        {"codec": "quant", "bits": 4},
        {"codec": "block", "rel": 1e-2, "adaptive": Adaptive(update_every=1)},
    ],
)
def test_restored_activations_keep_the_bound_and_gradients_stay_close(kw):
    torch.manual_seed(0)
    model = Mixed()
    x, y = batch(n=32)
    want = grads(model, contextlib.nullcontext(), x, y)
    ac = ActivationCompression(min_bytes=0, debug=True, **kw)  # debug: unpack checks the bound
    for _ in range(2):
        got = grads(model, ac, x, y)
    assert ac.stats.ratio > 1.5
    assert relative_error(want, got) < 0.2
    compressed = [r for r in ac.stats.rows.values() if r.stored_bytes < r.saved_bytes]
    assert compressed


def test_debug_check_catches_a_broken_bound(monkeypatch):
    from tensorpress.activation_offload.codec import ActivationCodec

    real = ActivationCodec.decompress
    monkeypatch.setattr(ActivationCodec, "decompress", lambda self, p, d: real(self, p, d) + 1.0)
    ac = ActivationCompression(codec="block", abs=1e-3, min_bytes=0, debug=True)
    x = torch.randn(100, 10, requires_grad=True)
    with ac:
        loss = torch.sin(x * 2).sum()
    with pytest.raises(AssertionError, match="breaks its bound"):
        loss.backward()


class Spy(torch.autograd.Function):
    """Saves its inputs; backward records what autograd hands back."""

    seen: list = []

    @staticmethod
    def forward(ctx, *ts):
        ctx.save_for_backward(*ts)
        return ts[0].clone() if ts[0].is_floating_point() else torch.zeros(1, requires_grad=True)

    @staticmethod
    def backward(ctx, g):
        Spy.seen[:] = list(ctx.saved_tensors)
        return (None,) * len(ctx.saved_tensors)


def test_what_must_pass_through_passes_through():
    lin = nn.Linear(64, 64)
    bn = nn.BatchNorm1d(64)
    act = torch.randn(256, 64, requires_grad=True) * 1.0
    small = torch.randn(4, 4) * 1.0
    ints = torch.arange(100000)
    flags = torch.rand(100000) > 0.5
    originals = [act, lin.weight, lin.weight.t(), bn.running_mean, small, ints, flags]
    ac = ActivationCompression(codec="block", rel=1e-2, model=nn.ModuleList([lin, bn]))
    with ac:
        out = Spy.apply(*originals)
    out.sum().backward()
    seen = Spy.seen
    assert seen[0] is not act and seen[0].shape == act.shape  # the activation was compressed
    for orig, got in zip(originals[1:], seen[1:], strict=True):
        # autograd hands saved inputs back as new tensor objects on the same memory
        assert got.data_ptr() == orig.data_ptr() and torch.equal(got, orig)
    assert ac.stats.saved_bytes == sum(
        t.numel() * t.element_size() for t in (act, small, ints, flags)
    )


def test_parameters_are_recognized_in_disguise():
    lin = nn.Linear(32, 32)
    params = ParameterStorages()
    x = torch.randn(8, 32)
    assert lin.weight in params and lin.weight.t() in params  # Parameter, and a view of one
    with torch.autocast("cpu", dtype=torch.bfloat16):
        w16 = lin.weight.to(torch.bfloat16)
    assert w16 in params and w16.t() in params  # autocast's cast copy: one step from the leaf
    params.add_module(nn.BatchNorm1d(4))
    assert x not in params and (x * 2) not in params
    # under autocast nothing of the weight is compressed as an activation
    ac = ActivationCompression(codec="block", rel=1e-2, min_bytes=0)
    with ac, torch.autocast("cpu", dtype=torch.bfloat16):
        lin(torch.randn(64, 32, requires_grad=True)).sum().backward()
    assert ac.stats.saved_bytes == 64 * 32 * 2  # only the bf16 input


def test_a_tensor_saved_twice_is_held_once():
    x = torch.randn(512, 256, requires_grad=True)
    ones = torch.ones(256, 4)
    ac = ActivationCompression(codec="block", rel=1e-2)
    with ac:
        h = torch.relu(x * 3)
        loss = (h * h).sum() + (h @ ones).sum()  # h saved by relu, by mul (twice), by mm
    n = h.numel() * 4
    assert ac.stats.saved_bytes == 3 * n + ones.numel() * 4
    assert ac.stats.stored_bytes < n / 4  # one compressed copy (~n/8), not three
    loss.backward()
    want = torch.autograd.grad(
        (torch.relu(x * 3) ** 2).sum() + (torch.relu(x * 3) @ torch.ones(256, 4)).sum(), x
    )[0]
    assert (x.grad - want).abs().max() < 0.2 * want.abs().max()


def test_a_new_storage_at_an_old_address_is_a_new_tensor():
    """Freed memory is handed to the next tensor: identity must follow the storage, not
    data_ptr. Two storages over one numpy buffer make the collision deterministic."""
    import numpy as np

    buf = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    first = buf.copy()
    ac = ActivationCompression(codec="block", abs=1e-6, min_bytes=0)
    with ac:
        a = torch.from_numpy(buf).requires_grad_()
        loss_a = torch.sin(a).sum()  # sin saves its input
        buf *= 3  # new values in the same memory...
        b = torch.from_numpy(buf).requires_grad_()  # ...under a new storage, same address
        assert b.data_ptr() == a.data_ptr()
        loss_b = torch.sin(b).sum()
    assert ac.stats.stored_bytes > 2 * 0.1 * 4096 * 4  # two records, not one
    (loss_a + loss_b).backward()
    assert torch.allclose(a.grad, torch.cos(torch.from_numpy(first)), atol=1e-5)
    assert torch.allclose(b.grad, torch.cos(torch.from_numpy(buf)), atol=1e-5)


@pytest.mark.parametrize("codec", [None, "block"])
def test_in_place_edit_after_saving_still_raises(codec):
    kw = {} if codec is None else {"rel": 1e-2}
    x = torch.randn(256, 256, requires_grad=True)
    with ActivationCompression(codec, **kw):
        y = torch.relu(x)  # relu saves its output
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()

    def forward(x):  # the edited tensor is gone by backward: the check must still fire
        h = torch.relu(x)
        h.mul_(2)
        return (h + 1).sum()

    with ActivationCompression(codec, **kw):
        loss = forward(x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    # and where autograd is happy, so are we
    with ActivationCompression(codec, **kw):
        h = torch.relu(x)
        h2 = h * 2
        h2.add_(1)  # mul by a scalar saves nothing: legal
        loss = h2.sum() + h.sum()
    loss.backward()


@pytest.mark.parametrize(("codec", "kw"), [("quant", {"bits": 2}), ("sz", {"rel": 5e-2})])
def test_exact_zeros_survive_lossy_codecs(codec, kw):
    x = torch.randn(300, 300)
    r = torch.relu(x)
    ac = ActivationCompression(codec, min_bytes=0, **kw)
    with ac:
        out = Spy.apply(r.clone().requires_grad_())
    out.sum().backward()
    got = Spy.seen[0]
    assert bool((got[r == 0] == 0).all())  # exact zeros stay exact
    if codec == "quant":  # and small values do not become zeros (ReLU reads `result > 0`)
        assert torch.equal(got == 0, r == 0)
    assert ac.stats.stored_bytes > r.numel() / 8  # the mask is counted


def test_no_grad_and_inference_mode_pass_untouched():
    torch.manual_seed(0)
    model = Mixed().eval()
    x, _ = batch()
    want = model(x)
    w = wrap(model, codec="block", rel=1e-2)
    with torch.no_grad():
        assert torch.equal(w(x), want)
    with torch.inference_mode():
        assert torch.equal(w(x), want)
    assert w.ac.stats.saved_bytes == 0


def test_mixed_precision_activations():
    torch.manual_seed(0)
    model = Mixed()
    x, y = batch(n=32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = grads(model, contextlib.nullcontext(), x, y)
        ac = ActivationCompression(codec="block", rel=1e-2, min_bytes=0, debug=True)
        got = grads(model, ac, x, y)
    assert ac.stats.ratio > 1.5
    assert relative_error(want, got) < 0.3
    h = torch.randn(128, 128, dtype=torch.float16, requires_grad=True)
    ac = ActivationCompression(codec="block", abs=1e-2, min_bytes=0, debug=True)
    with ac:
        loss = torch.tanh(h.float()).half().sum() + torch.sigmoid(h).sum()
    loss.backward()
    assert ac.stats.ratio > 1


def test_stats_per_module_and_exclusions():
    torch.manual_seed(0)
    model = Mixed()
    x, y = batch(n=32)
    w = wrap(model, codec="block", rel=1e-2, min_bytes=0, exclude=["attn*", nn.LayerNorm])
    F.cross_entropy(w(x), y).backward()
    rows = w.ac.stats.rows
    assert {"conv", "bn", "relu", "proj", "attn.qkv", "attn", "norm"} <= rows.keys()
    for name in ("attn.qkv", "attn.out", "norm"):
        assert rows[name].stored_bytes == rows[name].saved_bytes  # kept as they are
    assert rows["conv"].stored_bytes < rows["conv"].saved_bytes
    assert sum(r.saved_bytes for r in rows.values()) == w.ac.stats.saved_bytes
    assert w.ac.stats.peak_stored_bytes >= w.ac.stats.stored_bytes > 0
    assert "attn.qkv" in str(w.ac.stats)


def test_adaptive_state_travels_in_state_dict():
    torch.manual_seed(0)
    adaptive = Adaptive(update_every=2, gradient_error=1e-3)
    w = wrap(Mixed(), codec="block", rel=5e-2, adaptive=adaptive)
    x, y = batch()
    for _ in range(3):
        F.cross_entropy(w(x), y).backward()
    tols = w.ac.bounds.tolerances
    assert tols and all(0 < v < math.inf for v in tols.values())
    assert {"proj", "attn.qkv", "head", "conv"} & tols.keys()
    state = w.state_dict()
    fresh = wrap(Mixed(), codec="quant", bits=8)
    fresh.load_state_dict(state)
    assert fresh.ac.config == w.ac.config and fresh.ac.step == 3
    assert fresh.ac.bounds.tolerances == tols
    # the adapted bound is what a weighted layer gets, between the bound and the ceiling
    bounds, tol = fresh.ac.bounds, tols["proj"]
    assert bounds.tolerance("proj", "weighted", 0.0, 1e9) == tol
    assert bounds.tolerance("proj", "weighted", 0.0, tol / 2) == tol / 2
    assert bounds.tolerance("proj", "weighted", 2 * tol, 1e9) == 2 * tol
    assert bounds.tolerance("unseen", "weighted", 1.0, 5.0) == 1.0
    assert bounds.tolerance("relu", "other", 1.0, 5.0) == 1.0
    # settings saved before the zstd stage existed load with it off, as they ran
    old = dict(state)
    old_ac = dict(old["_extra_state"])
    old_ac["config"] = {k: v for k, v in old_ac["config"].items() if k != "zstd"}
    old["_extra_state"] = old_ac
    fresh.load_state_dict(old)
    assert fresh.ac.config["zstd"] is None and w.ac.config["zstd"] == 1
    # and run so: a repetitive batch is held in several times the bytes without zstd
    assert _stored_bytes(fresh) > 2 * _stored_bytes(w)


def _stored_bytes(wrapped) -> int:
    """The bytes ``wrapped`` holds for one step on a batch of 64 copies of one image."""
    x, y = batch(n=1)
    F.cross_entropy(wrapped(x.repeat(64, 1, 1, 1)), y.repeat(64)).backward()
    return wrapped.ac.stats.stored_bytes


def test_layer_kinds():
    from tensorpress.activation_offload.adaptive import layer_kind

    assert layer_kind(nn.Linear(2, 2)) == layer_kind(nn.Conv2d(1, 1, 3)) == "weighted"
    assert layer_kind(nn.BatchNorm2d(3)) == layer_kind(nn.LayerNorm(3)) == "other"
    assert layer_kind(nn.ReLU()) == layer_kind(nn.Sequential()) == layer_kind(None) == "other"


@pytest.mark.parametrize(
    "rel, adaptive, tol",
    [(1e-2, False, 1e-2), (5e-2, False, 5e-2), (1e-2, Adaptive(ceiling=0.03), 0.03)],
)
def test_log_probabilities_get_an_absolute_bound(rel, adaptive, tol):
    """Under ``rel`` a loss's log-probabilities are held within ``rel`` (absolute), not
    ``rel`` of their range, and adaptive bounds hold them within the ceiling: each
    probability in the gradient is off by a factor of at most e^tol."""
    g = torch.Generator().manual_seed(0)
    x = (6 * torch.randn(256, 512, generator=g)).requires_grad_()  # log-probs span ~-60..0
    target = torch.randint(0, 512, (256,), generator=g)
    ac = ActivationCompression(codec="block", rel=rel, adaptive=adaptive, debug=True)  # checked
    with ac:
        loss = F.cross_entropy(x, target)  # saves log_softmax's output
    n = x.numel() * 4
    assert ac.stats.saved_bytes >= 2 * n  # by log_softmax and by nll_loss
    assert ac.stats.stored_bytes < n / 2  # held once, compressed
    assert ac.stats.rows["(outside)"].tolerance == tol  # saved outside every module
    loss.backward()
    p = torch.softmax(x.detach(), 1)
    want = torch.autograd.grad(F.cross_entropy(x, target), x)[0]
    slack = (math.exp(tol) - 1) * p / len(x) + 1e-7
    assert bool(((x.grad - want).abs() <= slack).all())


def test_log_probabilities_are_kept_exact_by_quant():
    x = torch.randn(256, 512, requires_grad=True)
    target = torch.randint(0, 512, (256,))
    ac = ActivationCompression(codec="quant", bits=2)
    with ac:
        loss = F.cross_entropy(x * 2, target)
    n = x.numel() * 4
    assert n <= ac.stats.stored_bytes < 1.1 * n  # held once, whole
    loss.backward()
    want = torch.autograd.grad(F.cross_entropy(x * 2, target), x)[0]
    assert torch.equal(x.grad, want)


def test_compiled_model_matches_eager():
    torch.manual_seed(0)
    model = Mixed()
    x, y = batch()
    w = wrap(model, codec="block", rel=1e-2, min_bytes=0)
    want = grads(w, contextlib.nullcontext(), x, y)
    saved = w.ac.stats.saved_bytes
    compiled = torch.compile(w, backend="aot_eager")
    got = {
        k.removeprefix("_orig_mod."): v
        for k, v in grads(compiled, contextlib.nullcontext(), x, y).items()
    }
    assert w.ac.stats.saved_bytes > 0.5 * saved and w.ac.stats.ratio > 1.5
    assert relative_error(want, got) < 0.05


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"codec": "block", "rel": 1e-2, "abs": 1.0}, "exactly one error bound"),
        ({"codec": "quant", "rel": 1e-2}, "takes no error bound"),
        ({"codec": "zfp", "rel": 1e-2}, "unknown codec 'zfp'"),
        ({"codec": "zstd"}, "activation codec must be a lossy codec"),
        ({"codec": "block", "pw_rel": 1e-2, "adaptive": True}, "adaptive bounds need"),
        ({"codec": "block", "rel": -1.0}, "bound must be a finite number >= 0"),
        ({"codec": None, "min_bytes": -1}, "min_bytes"),
        ({"codec": "block", "rel": 1e-2, "ceiling": 0.05}, "ceiling"),  # Adaptive(ceiling=)
        ({"codec": "quant", "bits": 3}, "bits"),
        ({"codec": "block", "rel": 1e-2, "adaptive": Adaptive(ceiling=1e-3)}, "no smaller than"),
    ],
)
def test_bad_settings_say_what_to_do(kw, match):
    with pytest.raises(ValueError, match=match):
        ActivationCompression(**kw)


def test_contexts_do_not_nest_and_records_are_released():
    ac = ActivationCompression(codec="block", rel=1e-2)
    with ac:
        with pytest.raises(RuntimeError, match="does not nest"):
            ac.__enter__()
        x = torch.randn(512, 512, requires_grad=True)
        loss = torch.sin(x).sum()
    assert ac.stats.live_bytes > 0
    loss.backward()
    del loss
    assert ac.stats.live_bytes == 0
    rec = Kept(torch.zeros(3), 12, ac.stats)
    assert ac.stats.live_bytes == 12 and isinstance(rec.restore(), torch.Tensor)
    del rec
    assert ac.stats.live_bytes == 0


def _ddp_worker(rank: int, world: int, store: str, out: str) -> None:
    import faulthandler

    # a crash in native code, up to the process's last moment, leaves the stacks of all
    # its Python threads here (the file stays open until the process exits)
    faulthandler.enable(open(f"{out}.{rank}.stacks", "w"))  # noqa: SIM115
    _ddp_steps(rank, world, store, out)
    end_worker()


def _ddp_steps(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        x, y = batch(seed=rank, n=16)  # each rank its own data
        results = {}
        adaptive = Adaptive(update_every=1)
        for codec, kw in ((None, {}), ("block", {"rel": 1e-2, "adaptive": adaptive})):
            torch.manual_seed(0)
            model = Mixed()
            w = wrap(model, codec, min_bytes=0, **kw) if codec else wrap(model, None)
            ddp = DDP(w)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            for _ in range(2):
                opt.zero_grad()
                torch.manual_seed(1)
                F.cross_entropy(ddp(x), y).backward()
                opt.step()
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            every = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(every, flat)
            assert all(torch.equal(every[0], e) for e in every), "ranks disagree"
            results[codec] = (flat, w.ac.stats.ratio)
        exact, lossy = results[None][0], results["block"][0]
        assert results["block"][1] > 1.5
        assert float((exact - lossy).norm() / exact.norm()) < 0.05
        with open(f"{out}.{rank}", "w") as f:
            f.write("ok")
        del ddp, w, model, opt  # their gloo work finished before the group goes
        dist.barrier()  # neither rank tears down while the other still talks
    finally:
        dist.destroy_process_group()


def test_works_under_ddp_with_two_processes(tmp_path):
    import torch.multiprocessing as mp

    out = str(tmp_path / "result")
    try:
        mp.spawn(_ddp_worker, args=(2, str(tmp_path / "store"), out), nprocs=2, join=True)
    except Exception as exc:  # a worker that crashed in native code says where
        stacks = [tmp_path / f"result.{r}.stacks" for r in range(2)]
        told = "".join(f"\n--- {p.name}:\n{p.read_text()}" for p in stacks if p.exists())
        raise AssertionError(f"{exc}{told}") from exc
    assert [open(f"{out}.{r}").read() for r in range(2)] == ["ok", "ok"]


def test_sparse_saved_tensors_are_kept():
    sp = torch.sparse_coo_tensor(
        torch.tensor([[0, 1, 2], [2, 0, 1]]), torch.randn(3), (3, 3), check_invariants=True
    )
    d = torch.randn(3, 4, requires_grad=True)
    with ActivationCompression("block", rel=1e-2, min_bytes=0):
        loss = torch.sparse.mm(sp, d).sum()  # saves the sparse matrix
    loss.backward()
    assert torch.equal(d.grad, torch.autograd.grad(torch.sparse.mm(sp, d).sum(), d)[0])
