"""Quantized weight differences (qWD) and the ZeRO-style sharded optimizer, on gloo.

Two processes on localhost run every scenario once (a module fixture) and save what
they saw; the tests check it here:

* qWD: each step's reconstruction is within the quantization bound of the exact
  weights (``scale / 2`` per value of the group that quantized its difference,
  nearest rounding; ``scale`` with stochastic rounding), exact after a refresh,
  bit-identical on both ranks, and the bytes counted follow the wire formula;
* the sharded loop trains a tiny regression model with and without qWD; without
  qWD it equals a plain single-process Adam run on the averaged gradients.
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from dist_workers import end_worker, free_port
from tensorpress.distributed.sharded_optimizer import ShardedOptimizer
from tensorpress.distributed.weight_diff import WeightDiffQuantizer, shard_numel
from tensorpress.distributed.wire import quantize_groups, wire_nbytes

WORLD = 2
NUMEL = 5001  # odd: the last shard is padded
QWD = {"bits": 4, "group": 512, "refresh_every": 4}
QWD_STOCHASTIC = {"bits": 2, "group": 256, "refresh_every": None, "stochastic": True}
QWD_STEPS = 10
TRAIN_STEPS, BATCH, LR = 40, 32, 2e-2
TRAIN_QWD = {"bits": 4, "group": 64, "refresh_every": 10}


# --------------------------------------------------------------------------- workers


def _exact_weights(step: int) -> torch.Tensor:
    """The weights every rank's optimizer would hold at ``step`` (a drifting random walk)."""
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(NUMEL, generator=g)
    for _ in range(step):
        w = w + 0.01 * torch.randn(NUMEL, generator=g) + 0.002
    return w


def _run_qwd(kwargs: dict) -> dict:
    wq = WeightDiffQuantizer(NUMEL, **kwargs)
    start, stop = wq.shard_range()
    out = {"prev": [], "recon": [], "refresh": [], "bytes": [], "shard": wq.shard_numel}
    for step in range(QWD_STEPS):
        prev = None if wq.weights is None else wq.weights.clone()
        out["refresh"].append(wq.is_refresh_step())
        recon = wq.gather(_exact_weights(step)[start:stop]).clone()
        out["prev"].append(prev)
        out["recon"].append(recon)
        out["bytes"].append(wq.bytes_sent)
    out["full_bytes"] = wq.full_precision_bytes
    return out


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(BATCH, 8, generator=g)
    return x, torch.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]


def _eval_loss(model: nn.Module) -> float:
    with torch.no_grad():
        x, y = _batch(99_999, 0)
        return nn.functional.mse_loss(model(x), y).item()


def _adam(params):
    return torch.optim.Adam(params, lr=LR)


def _run_sharded(weight_quantizer, grad_bits=None) -> dict:
    model = _model()
    opt = ShardedOptimizer(
        model.parameters(), _adam, weight_quantizer=weight_quantizer, grad_bits=grad_bits
    )
    first = _eval_loss(model)
    for step in range(TRAIN_STEPS):
        opt.zero_grad()
        x, y = _batch(step, dist.get_rank())
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {
        "first": first,
        "last": _eval_loss(model),
        "flat": flat,
        "numel": opt.numel,
        "steps": opt.steps,
        "grad_bytes": opt.grad_bytes,
        "weight_bytes": opt.weight_bytes,
        "grad_full_bytes": opt.grad_full_bytes,
        "weight_full_bytes": opt.weight_full_bytes,
    }


def _run_reference() -> torch.Tensor:
    """Single-process Adam on the mean of both ranks' gradients."""
    model = _model()
    opt = _adam(model.parameters())
    for step in range(TRAIN_STEPS):
        grads = []
        for rank in range(WORLD):
            model.zero_grad()
            x, y = _batch(step, rank)
            nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads, strict=True):
            total = gs[0].clone()
            for g in gs[1:]:
                total += g
            p.grad = total / WORLD
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        results = {
            "qwd": _run_qwd(QWD),
            "qwd_stochastic": _run_qwd(QWD_STOCHASTIC),
            "sharded": _run_sharded(False),
            "sharded_qwd": _run_sharded(TRAIN_QWD),
            "sharded_qwd_grad8": _run_sharded(TRAIN_QWD, grad_bits=8),
            "reference": _run_reference(),
        }
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
    end_worker()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwd")
    mp.spawn(_worker, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


# --------------------------------------------------------------------------- qWD


def _bound(exact: torch.Tensor, prev: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """Per-value error bound of one quantized step from the group scales of each shard's
    difference: scale/2 (nearest) or scale (stochastic), plus float32 rounding slack."""
    m = shard_numel(NUMEL, WORLD)
    pad = torch.zeros(WORLD * m)
    pad[:NUMEL] = exact
    diff = pad - torch.cat([prev, torch.zeros(WORLD * m - NUMEL)])
    per_value = []
    for piece in diff.view(WORLD, m):
        q = quantize_groups(piece, bits=kwargs["bits"], group=kwargs["group"])
        scale = q.scale.repeat_interleave(kwargs["group"])[:m]
        per_value.append(scale if kwargs.get("stochastic") else scale / 2)
    slack = 4 * torch.finfo(torch.float32).eps * (exact.abs() + prev.abs())
    return torch.cat(per_value)[:NUMEL] * (1 + 1e-5) + slack


@pytest.mark.parametrize("name,kwargs", [("qwd", QWD), ("qwd_stochastic", QWD_STOCHASTIC)])
def test_reconstruction_within_bound_and_exact_after_refresh(runs, name, kwargs):
    res = runs[0][name]
    quantized = 0
    for step in range(QWD_STEPS):
        exact, recon = _exact_weights(step), res["recon"][step]
        if res["refresh"][step]:
            assert torch.equal(recon, exact), f"step {step}: a refresh must be exact"
            continue
        quantized += 1
        err = (recon - exact).abs()
        bound = _bound(exact, res["prev"][step], kwargs)
        assert torch.all(err <= bound), f"step {step}: max excess {(err - bound).max():.3g}"
        assert err.max() > 0  # the difference really was quantized
    assert quantized >= QWD_STEPS // 2


def test_qwd_refresh_steps_follow_refresh_every(runs):
    every = QWD["refresh_every"]
    assert runs[0]["qwd"]["refresh"] == [s % every == 0 for s in range(QWD_STEPS)]
    assert runs[0]["qwd_stochastic"]["refresh"] == [s == 0 for s in range(QWD_STEPS)]


@pytest.mark.parametrize("name", ["qwd", "qwd_stochastic"])
def test_all_ranks_hold_identical_weights(runs, name):
    for a, b in zip(runs[0][name]["recon"], runs[1][name]["recon"], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name,kwargs", [("qwd", QWD), ("qwd_stochastic", QWD_STOCHASTIC)])
def test_bytes_follow_the_wire_formula(runs, name, kwargs):
    m = shard_numel(NUMEL, WORLD)
    wire = wire_nbytes(m, kwargs["bits"], kwargs["group"])
    assert wire < 4 * m * kwargs["bits"] / 16  # well under half of bits/32 of float32
    for r in range(WORLD):
        res = runs[r][name]
        assert res["shard"] == m
        expected, total = [], 0
        for refresh in res["refresh"]:  # the shard goes to every other rank
            total += (WORLD - 1) * (4 * m if refresh else wire)
            expected.append(total)
        assert res["bytes"] == expected
        assert res["full_bytes"] == QWD_STEPS * (WORLD - 1) * 4 * m


# --------------------------------------------------------------------------- sharded loop


@pytest.mark.parametrize("name", ["sharded", "sharded_qwd", "sharded_qwd_grad8"])
def test_sharded_loop_trains(runs, name):
    for r in range(WORLD):
        res = runs[r][name]
        assert res["last"] < 0.5 * res["first"]
    assert torch.equal(runs[0][name]["flat"], runs[1][name]["flat"])


def test_sharded_loop_matches_single_process_reference(runs):
    ref = runs[0]["reference"]
    for r in range(WORLD):
        torch.testing.assert_close(runs[r]["sharded"]["flat"], ref, rtol=1e-5, atol=1e-6)
    # qWD is close but not equal: its weights carry a bounded quantization error
    assert not torch.equal(runs[0]["sharded_qwd"]["flat"], ref)


def test_sharded_loop_byte_counts(runs):
    for r in range(WORLD):
        plain, qwd, g8 = (runs[r][k] for k in ("sharded", "sharded_qwd", "sharded_qwd_grad8"))
        m, others = shard_numel(plain["numel"], WORLD), WORLD - 1  # bytes go to other ranks
        assert plain["steps"] == TRAIN_STEPS
        full = TRAIN_STEPS * others * 4 * m
        assert plain["weight_bytes"] == plain["weight_full_bytes"] == full
        assert plain["grad_bytes"] == plain["grad_full_bytes"] == full
        refreshes = -(-TRAIN_STEPS // TRAIN_QWD["refresh_every"])
        wire = wire_nbytes(m, TRAIN_QWD["bits"], TRAIN_QWD["group"])
        quantized = TRAIN_STEPS - refreshes
        assert qwd["weight_bytes"] == others * (refreshes * 4 * m + quantized * wire)
        assert qwd["grad_bytes"] == plain["grad_bytes"]
        assert g8["grad_bytes"] == TRAIN_STEPS * others * wire_nbytes(m, 8, 128)
        assert g8["grad_bytes"] < g8["grad_full_bytes"] / 2


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"numel": 0}, "numel"),
        ({"numel": 2.5}, "numel"),
        ({"bits": 3}, "bits"),
        ({"bits": 16}, "bits"),
        ({"group": 0}, "group"),
        ({"group": True}, "group"),
        ({"refresh_every": 0}, "refresh_every"),
        ({"refresh_every": -3}, "refresh_every"),
    ],
)
def test_weight_diff_construction_errors(kwargs, match):
    args = {"numel": 10, **kwargs}
    with pytest.raises(ValueError, match=match):
        WeightDiffQuantizer(**args)


def test_weight_diff_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        WeightDiffQuantizer(10)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"grad_bits": 5}, ValueError, "grad_bits"),
        ({"weight_quantizer": "yes"}, TypeError, "weight_quantizer"),
    ],
)
def test_sharded_optimizer_construction_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        ShardedOptimizer(nn.Linear(2, 2).parameters(), _adam, **kwargs)


def test_sharded_optimizer_rejects_empty_and_non_float32_params():
    with pytest.raises(ValueError, match="empty"):
        ShardedOptimizer([], _adam)
    with pytest.raises(ValueError, match="float32"):
        ShardedOptimizer(nn.Linear(2, 2).double().parameters(), _adam)
