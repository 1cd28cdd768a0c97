"""The compressed embedding all-to-all and its adaptive bounds, with 2 gloo processes.

One launch runs every scenario in the workers and saves what they measured; the
tests judge those numbers. Every rank can rebuild every table and the whole global
batch from seeds, so each worker knows the exact values and gradients that should
arrive.
"""

from __future__ import annotations

import io
import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from dist_workers import end_worker, free_port
from tensorpress.compress import ErrorBound
from tensorpress.distributed.adaptive_bounds import AdaptiveBounds
from tensorpress.distributed.embedding_a2a import EmbeddingAllToAll

WORLD = 2
DIM = 5  # odd, so no block of 64 values lines up with a row
TABLE_ROWS = [7, 13, 101]  # odd table sizes
FWD = [{"id": "block", "abs": 1e-2}, {"id": "block", "rel": 1e-2}, {"id": "block", "abs": 3e-3}]
BWD = [{"id": "block", "abs": 1e-4}, {"id": "block", "abs": 1e-3}, {"id": "block", "rel": 2e-2}]


def _tables(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.EmbeddingBag(n, DIM, mode="sum", _weight=torch.randn(n, DIM, generator=g))
            for n in sizes]  # fmt: skip


def _bags(sizes, batch, seed=1):
    """(ids, offsets) per table for ``batch`` bags of 0-3 ids: about a quarter empty."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        counts = torch.randint(0, 4, (batch,), generator=g)
        ids = torch.randint(0, n, (int(counts.sum()),), generator=g)
        out.append((ids, torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)[:-1]])))
    return out


def _exact(tables, bags):
    """float32 [global batch, tables, DIM]: every table pooled over the whole batch."""
    with torch.no_grad():
        return torch.stack([t(ids, off) for t, (ids, off) in zip(tables, bags, strict=True)], 1)


def _grad_weights(batch_sizes, ntables):
    """The d loss / d output of each rank: loss_r = sum(out_r * W_r)."""
    g = torch.Generator().manual_seed(5)
    return [torch.randn(b, ntables, DIM, generator=g) * 1e-2 for b in batch_sizes]


def _span(x):
    return (x.max() - x.min()).item() if x.numel() else 0.0


def _bound(spec, block):
    return spec["abs"] if "abs" in spec else spec["rel"] * _span(block)


def _round_trip(rank, tables_per_rank, batch_sizes, fwd, bwd):
    """Forward and backward through the all-to-all; the excess of each table's error over
    its bound (<= 0 when every value is within), and the arriving tensors."""
    ntables = sum(tables_per_rank)
    sizes = (TABLE_ROWS * ntables)[:ntables]
    tables, bags = _tables(sizes), _bags(sizes, sum(batch_sizes))
    exact = _exact(tables, bags)
    first = sum(tables_per_rank[:rank])
    mine = list(range(first, first + tables_per_rank[rank]))
    a2a = EmbeddingAllToAll(tables_per_rank, DIM, forward=fwd, backward=bwd)
    pooled = exact[:, mine].clone().requires_grad_(True)
    out = a2a(pooled, batch_sizes)
    lo = sum(batch_sizes[:rank])
    rows = slice(lo, lo + batch_sizes[rank])
    weights = _grad_weights(batch_sizes, ntables)
    (out * weights[rank]).sum().backward()
    grads = torch.cat(weights)  # d loss / d pooled of every table, all ranks' rows
    excess = {}
    for t in range(ntables):
        want = exact[rows, t]
        err = (
            (out[:, t].detach().double() - want.double()).abs().max().item() if want.numel() else 0
        )
        excess["fwd", t] = err - (_bound(fwd[t], want) if fwd else 0.0)
    for j, t in enumerate(mine):
        at = 0
        for b, w in zip(batch_sizes, weights, strict=True):
            want, got = w[:, t], pooled.grad[at : at + b, j]
            err = (got.double() - want.double()).abs().max().item() if b else 0.0
            excess["bwd", t, at] = err - (_bound(bwd[t], want) if bwd else 0.0)
            at += b
    return {
        "excess": excess,
        "out": out.detach(),
        "grad": pooled.grad,
        "want_out": exact[rows],
        "want_grad": grads[:, mine],
        "stats": (a2a.forward_stats, a2a.backward_stats),
    }


def _plain_exchange(rank, tables_per_rank, batch_sizes):
    """The forward exchange with one plain all_to_all_single of float32 rows."""
    ntables = sum(tables_per_rank)
    sizes = (TABLE_ROWS * ntables)[:ntables]
    exact = _exact(_tables(sizes), _bags(sizes, sum(batch_sizes)))
    first = sum(tables_per_rank[:rank])
    pooled = exact[:, first : first + tables_per_rank[rank]].contiguous()
    recv = [torch.empty(batch_sizes[rank], n, DIM) for n in tables_per_rank]
    flat = torch.empty(sum(r.numel() for r in recv))
    dist.all_to_all_single(
        flat, pooled.reshape(-1), [r.numel() for r in recv],
        [b * pooled.shape[1] * DIM for b in batch_sizes],
    )  # fmt: skip
    parts = flat.split([r.numel() for r in recv])
    return torch.cat([p.view_as(r) for p, r in zip(parts, recv, strict=True)], 1)


def _error_of(fn):
    try:
        fn()
    except ValueError as exc:
        return type(exc).__name__, str(exc)
    return None


def _errors(rank):
    """Each bad call fails on both ranks; a good exchange afterwards still works."""
    res = {}
    a2a = EmbeddingAllToAll([1, 1], DIM, forward={"id": "block", "abs": 1e-3})
    x = torch.randn(4, 1, DIM)
    bad = torch.randn(4, 1, DIM + rank)  # rank 1 passes the wrong width
    res["shape"] = _error_of(lambda: a2a(bad))
    res["batch"] = _error_of(lambda: a2a(x, [2, 2] if rank == 0 else [1, 3]))
    res["odd batch"] = _error_of(lambda: a2a(torch.randn(3, 1, DIM)))
    res["dtype"] = _error_of(lambda: a2a(x.double() if rank else x))
    other = {"id": "block", "abs": 1e-3} if rank == 0 else {"id": "quant", "bits": 4}
    res["config"] = _error_of(lambda: EmbeddingAllToAll([1, 1], DIM, forward=other)(x))
    res["bound"] = _error_of(lambda: EmbeddingAllToAll([1, 1], DIM, forward={"id": "block"}))
    res["negative"] = _error_of(
        lambda: EmbeddingAllToAll([1, 1], DIM, backward={"id": "block", "abs": -1.0})
    )
    res["after"] = a2a(x).shape
    return res


def _model():
    """This rank's table of two and a linear head over both tables' pooled values."""
    torch.manual_seed(0)
    table = _tables([11, 11], seed=3)[dist.get_rank()]
    head = torch.nn.Linear(2 * DIM, 1)
    return table, head, torch.optim.SGD([*table.parameters(), *head.parameters()], lr=0.05)


def _train(model, a2a, adaptive, steps, start=0):
    """Train ``steps`` steps from step ``start``; the bounds after every step."""
    table, head, opt = model
    seen = []
    for step in range(start, start + steps):
        y = torch.randn(4, 1, generator=torch.Generator().manual_seed(step))
        ids, off = _bags([11, 11], 8, seed=100 + step)[dist.get_rank()]
        out = a2a(table(ids, off)[:, None])
        loss = (head(out.reshape(out.shape[0], -1)) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        adaptive.step(loss.item())
        seen.append([adaptive.bound(d, t, a2a.forward_codecs[0].bound).value
                     for d in ("forward", "backward") for t in range(2)])  # fmt: skip
    return seen


def _resume(rank):
    """Ten steps in one run; and five steps, a state_dict round trip into a new
    AdaptiveBounds and all-to-all, five more (the model carries on, as from its own
    checkpoint)."""
    codec = {"id": "block", "rel": 1e-2}

    def fresh():
        ad = AdaptiveBounds(2, warmup=2)
        return EmbeddingAllToAll([1, 1], DIM, forward=codec, backward=codec, adaptive=ad), ad

    whole = _train(_model(), *fresh(), 10)
    model = _model()
    a2a, ad = fresh()
    first = _train(model, a2a, ad, 5)
    buf = io.BytesIO()
    torch.save(ad.state_dict(), buf)
    a2a, ad = fresh()
    ad.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    return {"whole": whole, "resumed": first + _train(model, a2a, ad, 5, start=5)}


def _worker(rank, port, outdir):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    torch.set_num_threads(1)
    res = {}
    try:
        res["bounded"] = _round_trip(rank, [2, 1], [3, 6], FWD, BWD)
        res["one each"] = _round_trip(rank, [1, 1], [0, 5], FWD[:2], BWD[:2])
        res["raw"] = _round_trip(rank, [2, 1], [4, 5], None, None)
        res["plain"] = _plain_exchange(rank, [2, 1], [4, 5])
        res["errors"] = _errors(rank)
        res["resume"] = _resume(rank)
    finally:
        with open(os.path.join(outdir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(res, f)
        dist.destroy_process_group()
    end_worker()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    outdir = str(tmp_path_factory.mktemp("a2a"))
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if method == "forkserver":
        mp.get_context(method).set_forkserver_preload(["torch", "tensorpress.distributed"])
    mp.start_processes(_worker, args=(free_port(), outdir), nprocs=WORLD, start_method=method)
    out = []
    for r in range(WORLD):
        with open(os.path.join(outdir, f"{r}.pkl"), "rb") as f:
            out.append(pickle.load(f))
    return out


@pytest.mark.parametrize("case", ["bounded", "one each"])
def test_values_and_gradients_arrive_within_their_bounds(results, case):
    for r in results:
        m = r[case]
        assert m["excess"] and max(m["excess"].values()) <= 0.0, m["excess"]
        assert m["out"].shape == m["want_out"].shape
        assert m["grad"].shape == m["want_grad"].shape


def test_empty_bags_and_an_empty_batch_part(results):
    # empty bags pool to exact zeros, which the block codec keeps exact
    m = results[1]["bounded"]
    zeros = m["want_out"] == 0
    assert zeros.any() and (m["out"][zeros] == 0).all()
    assert results[0]["one each"]["out"].shape == (0, 2, DIM)


def test_compression_sends_fewer_bytes(results):
    for r in results:
        fwd, bwd = r["bounded"]["stats"]
        raw_fwd, raw_bwd = r["raw"]["stats"]
        assert fwd.calls == bwd.calls == 1
        assert 0 < fwd.payload_bytes < fwd.raw_bytes and 0 < bwd.payload_bytes < bwd.raw_bytes
        assert raw_fwd.payload_bytes == raw_fwd.raw_bytes and raw_fwd.ratio < 1.0
        assert fwd.codec_seconds > 0.0


def test_raw_bytes_count_what_goes_to_the_other_rank(results):
    # rank 0 owns tables 0 and 1 and sends rank 1 its 5 rows; rank 1 sends rank 0 4 rows
    assert results[0]["raw"]["stats"][0].raw_bytes == 5 * 2 * DIM * 4
    assert results[1]["raw"]["stats"][0].raw_bytes == 4 * 1 * DIM * 4
    assert results[0]["raw"]["stats"][1].raw_bytes == 4 * 1 * DIM * 4  # grads of table 2


def test_without_compression_bit_identical_to_plain_all_to_all(results):
    for r in results:
        assert torch.equal(r["raw"]["out"], r["plain"])
        assert torch.equal(r["raw"]["out"], r["raw"]["want_out"])
        assert torch.equal(r["raw"]["grad"], r["raw"]["want_grad"])


@pytest.mark.parametrize(
    "case,match",
    [
        ("shape", "shape"),
        ("batch", "batch sizes"),
        ("odd batch", "batch_sizes"),
        ("dtype", "dtype"),
        ("config", "codec config"),
        ("bound", "needs an abs or rel bound"),
        ("negative", "must be a finite number >= 0"),
    ],
)
def test_errors_are_raised_on_every_rank(results, case, match):
    for rank, r in enumerate(results):
        err = r["errors"][case]
        assert err is not None, (rank, case)
        if case == "shape" and rank == 0:
            assert "rank 1" in err[1]  # rank 0's input was fine: it names the rank that was not
        else:
            assert match in err[1], err
    assert all(r["errors"]["after"] == (2, 2, DIM) for r in results)


def test_resumed_adaptive_bounds_continue_with_the_same_bounds(results):
    for r in results:
        whole, resumed = r["resume"]["whole"], r["resume"]["resumed"]
        assert len(whole) == 10 and whole == resumed
        assert len({tuple(b) for b in whole}) > 1  # the bounds did move


# -- AdaptiveBounds on its own ---------------------------------------------------------


def _observed(sensitivity, steps=3):
    ad = AdaptiveBounds(len(sensitivity), max_ratio=4.0, early=1.0)
    for _ in range(steps):
        grads = torch.stack([torch.full((8, 3), s) for s in sensitivity], 1)
        ad.observe("backward", range(len(sensitivity)), grads)
        ad.observe("forward", range(len(sensitivity)), torch.ones(8, len(sensitivity), 3))
    return ad


def test_a_table_the_loss_hardly_depends_on_gets_a_looser_bound():
    ad = _observed([1.0, 1.0, 0.25])
    given = ErrorBound("abs", 1e-2)
    unseen = AdaptiveBounds(3).bound("forward", 0, given)
    assert unseen.value == pytest.approx(2e-2)  # unobserved: the step factor only (early=2)
    b = [ad.bound("backward", t, given).value for t in range(3)]
    assert b[2] > b[0] == b[1]
    # the same first-order loss perturbation as the fixed bound: sum e_t G_t = e sum G_t
    assert sum(e * g for e, g in zip(b, [1.0, 1.0, 0.25], strict=True)) == pytest.approx(
        1e-2 * 2.25
    )


def test_table_factor_is_clipped():
    ad = _observed([1.0, 1e-6])
    assert ad.table_factor("backward", 1, "abs") == 4.0


def test_step_factor_starts_loose_and_tightens_as_the_loss_flattens():
    ad = AdaptiveBounds(1, early=3.0, warmup=5)
    factors = [ad.step(10.0 * 0.9**k + 1.0) for k in range(60)]
    factors += [ad.step(1.0) for _ in range(1000)]
    assert factors[0] == 3.0
    assert all(a >= b for a, b in zip(factors, factors[1:], strict=False))
    assert factors[-1] == pytest.approx(1.0, abs=0.02)
    assert ad.step(float("nan")) == factors[-1]


def test_state_dict_round_trip():
    ad = _observed([1.0, 0.5])
    for k in range(30):
        ad.step(5.0 / (k + 1))
    back = AdaptiveBounds(2)
    back.load_state_dict(pickle.loads(pickle.dumps(ad.state_dict())))
    for d in ("forward", "backward"):
        for t in range(2):
            assert back.bound(d, t, ErrorBound("abs", 1e-3)) == ad.bound(
                d, t, ErrorBound("abs", 1e-3)
            )
    with pytest.raises(ValueError, match="state is for 2 tables"):
        AdaptiveBounds(3).load_state_dict(ad.state_dict())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"max_ratio": 1.0}, "max_ratio"),
        ({"early": 0.5}, "early"),
        ({"momentum": 1.0}, "momentum"),
        ({"fast": 0.99, "slow": 0.9}, "below slow"),
        ({"warmup": -1}, "warmup"),
    ],
)
def test_adaptive_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveBounds(2, **kwargs)


def test_needs_an_initialized_process_group():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        EmbeddingAllToAll([1], DIM)
