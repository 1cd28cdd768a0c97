"""The quantized all-reduce DDP hook on gloo with 2 and 4 local processes.

One launch per world size runs every scenario in the workers and saves what
they measured (errors, bounds, bytes, losses); the tests judge those numbers.
Bounds come from the per-group scales the hook used
(``state.last_error_bound``: each stage errs by at most half its group's scale
per value, composed over the stages).
"""

from __future__ import annotations

import math
import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from dist_workers import end_worker, free_port
from tensorpress.distributed.comm_hooks import (
    QuantizedAllReduceState,
    hook_wire_nbytes,
    quantized_allreduce,
    quantized_allreduce_hook,
    ring_allreduce_nbytes,
    shard_size,
)
from tensorpress.distributed.wire import wire_nbytes

N = 3001  # bucket values: not a multiple of world size * group, so the hook pads
STEPS = 40  # error-feedback steps
SLACK = 1e-5  # float32 rounding, relative to the largest |value|


def _grads(kind: str, world: int, step: int = 0) -> torch.Tensor:
    """float32 [world, N]: every rank's gradient (all ranks can rebuild all of them)."""
    g = torch.Generator().manual_seed(1000 * step + world + (7 if kind == "outliers" else 0))
    x = torch.randn(world, N, generator=g)
    if kind == "outliers":  # 1% of the values 100x larger
        x[torch.rand(world, N, generator=g) < 0.01] *= 100.0
    return x


def _bound_run(ranks_per_node, kind, hadamard, world, rank, dtype=torch.float32, pg=None):
    st = QuantizedAllReduceState(
        pg, ranks_per_node=ranks_per_node, hadamard=hadamard, error_feedback=False,
        record_error_bound=True,
    )  # fmt: skip
    grads = _grads(kind, world)
    out = quantized_allreduce(st, grads[rank].to(dtype).view(-1, 1), key=0)
    exact = grads.to(dtype).float().mean(0)
    assert out.shape == (N, 1) and out.dtype == dtype
    err = (out.float().view(-1) - exact).abs()
    bound = st.last_error_bound
    if dtype != torch.float32:  # the result is rounded to the bucket dtype
        bound = bound + exact.abs() * torch.finfo(dtype).eps
    return {
        "excess": (err - bound - SLACK * grads.abs().max()).max().item(),
        "rms": err.pow(2).mean().sqrt().item(),
        "bound_max": bound.max().item(),
        "bytes": st.bytes_sent,
        "calls": st.calls,
    }


def _feedback_run(ranks_per_node, error_feedback, world, rank):
    """Running sum of outputs minus running sum of exact averages, over STEPS steps of a
    gradient that repeats (with small noise): without feedback its error repeats too."""
    st = QuantizedAllReduceState(
        None, ranks_per_node=ranks_per_node, error_feedback=error_feedback,
        record_error_bound=True,
    )  # fmt: skip
    base = _grads("random", world)
    drift = torch.zeros(N)
    excess = -math.inf
    for step in range(STEPS):
        grads = base + 0.01 * _grads("random", world, step + 1)
        drift += quantized_allreduce(st, grads[rank], key="bucket") - grads.mean(0)
        excess = max(excess, (drift.abs() - st.last_error_bound - 1e-4).max().item())
    return {"drift": drift.abs().max().item(), "excess": excess, "steps": st.steps}


def _ddp_run(ranks_per_node, world, rank, widths, steps, bucket_cap_mb=25.0):
    """Train an MLP of ``widths`` for ``steps`` steps with the hook; record bucket sizes."""
    torch.manual_seed(0)  # same initial weights everywhere
    layers = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers[:-1])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    st = QuantizedAllReduceState(None, ranks_per_node=ranks_per_node)
    buckets = []  # (index, values) of every bucket reduced

    def recording_hook(state, bucket):
        buckets.append((bucket.index(), bucket.buffer().numel()))
        return quantized_allreduce_hook(state, bucket)

    ddp.register_comm_hook(st, recording_hook)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, widths[0], generator=g)
    y = x[:, :1] * 2.0 - x[:, 1:2]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    same = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(same, flat)
    return {
        "first": losses[0],
        "last": losses[-1],
        "replicas_equal": all(torch.equal(flat, o) for o in same),
        "buckets": buckets,
        "nparams": flat.numel(),
        "bytes": st.bytes_sent,
        "steps": st.steps,
        "calls": st.calls,
        "residual_keys": sorted(st.residual_keys),
        "size_checks": st.size_checks,  # once per bucket layout, not every step
        "cleared": _cleared(st),
    }


def _cleared(st: QuantizedAllReduceState) -> tuple:
    """(size_checks, residual_keys) after reset_counters and clear_residuals."""
    st.reset_counters()
    st.clear_residuals()
    return st.size_checks, st.residual_keys


def _nonfinite_grads(world: int, step: int) -> torch.Tensor:
    """``_grads`` with, at step 1, a NaN on rank 0, +Inf on the last rank, -Inf on rank 0
    where the last rank has +Inf (plain sum: NaN) and on another rank alone (plain: -Inf);
    each non-finite value shares its group with finite ones."""
    x = _grads("random", world, step)
    if step == 1:
        last = world - 1
        x[0, 5] = math.nan
        x[last, [300, 301, 2999]] = math.inf
        x[0, 301] = -math.inf
        x[1 if world > 2 else 0, 1000] = -math.inf
    return x


def _nonfinite_run(ranks_per_node, hadamard, world, rank):
    """Four steps with error feedback against plain all-reduce (DDP's ``allreduce_hook``:
    divide, then sum); step 1 holds NaN and +-Inf. Per step: whether the non-finite
    positions and signs match, and how far finite outputs exceed the bound of ``|out -
    exact| <= bound(step) + bound(step - 1)`` (the residuals telescope)."""
    st = QuantizedAllReduceState(None, ranks_per_node=ranks_per_node, hadamard=hadamard,
                                 record_error_bound=True)  # fmt: skip
    steps, before = [], torch.zeros(N)
    for step in range(4):
        grads = _nonfinite_grads(world, step)
        out = quantized_allreduce(st, grads[rank].clone(), key="b")
        plain = grads[rank] / world
        dist.all_reduce(plain)
        fin = plain.isfinite()
        limit = st.last_error_bound + before + 1e-4
        steps.append({
            "same_nonfinite": all(torch.equal(f(out), f(plain))
                                  for f in (torch.isnan, torch.isposinf, torch.isneginf)),
            "nonfinite": int((~fin).sum()),
            "excess": ((out - plain).abs() - limit)[fin].max().item(),
            "bound_finite": bool(st.last_error_bound.isfinite().all()),
        })  # fmt: skip
        before = st.last_error_bound
    return steps


def _scaler_run(ranks_per_node, world, rank, hooked, steps=16, bad_step=4):
    """An MLP trained with DDP and a CPU ``GradScaler``; at ``bad_step`` the last rank's loss
    is multiplied by Inf (Inf and NaN gradients there), so the scaler skips that step.
    Records the losses and the steps the scaler skipped (its scale dropped)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if hooked:
        ddp.register_comm_hook(
            QuantizedAllReduceState(None, ranks_per_node=ranks_per_node), quantized_allreduce_hook
        )
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 8, generator=g)
    y = x[:, :1] * 2.0 - x[:, 1:2]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    losses, skipped = [], []
    for step in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        poison = math.inf if step == bad_step and rank == world - 1 else 1.0
        scale = scaler.get_scale()
        scaler.scale(loss * poison).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        if scaler.get_scale() < scale:
            skipped.append(step)
    finite = all(p.isfinite().all() for p in model.parameters())
    return {"losses": losses, "skipped": skipped, "finite": finite}


def _worker(rank, world, port, outdir, ranks_per_node):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.set_num_threads(1)
    res = {}
    try:
        for kind in ("random", "outliers"):
            for hadamard in (False, True):
                res["bound", kind, hadamard] = _bound_run(
                    ranks_per_node, kind, hadamard, world, rank
                )
        res["bound", "bf16"] = _bound_run(
            ranks_per_node, "random", True, world, rank, torch.bfloat16
        )
        # a process group other than the default one builds its subgroups locally
        pg = dist.new_group(list(range(world)))
        res["bound", "own group"] = _bound_run(ranks_per_node, "random", True, world, rank, pg=pg)
        for ef in (False, True):
            res["feedback", ef] = _feedback_run(ranks_per_node, ef, world, rank)
        for hadamard in (False, True):
            res["nonfinite", hadamard] = _nonfinite_run(ranks_per_node, hadamard, world, rank)
        for hooked in (False, True):
            res["scaler", hooked] = _scaler_run(ranks_per_node, world, rank, hooked)
        res["ddp"] = _ddp_run(ranks_per_node, world, rank, (8, 32, 1), steps=30)
        # 1.4 MB of gradients: DDP rebuilds one bucket into two after the first step
        res["buckets"] = _ddp_run(ranks_per_node, world, rank, (8, 600, 600, 1), 3, 0.5)
    finally:
        with open(os.path.join(outdir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(res, f)
        dist.destroy_process_group()
    end_worker()


def _mismatch_worker(rank, world, port, outdir, ranks_per_node):
    """Rank r passes 100 + 50 r values, then every rank 100: the error, then the result."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    res = {}
    try:
        st = QuantizedAllReduceState(None, ranks_per_node=ranks_per_node, record_error_bound=True)
        try:
            quantized_allreduce(st, torch.ones(100 + 50 * rank))
        except ValueError as e:
            res["error"] = str(e)
        res["after"] = quantized_allreduce(st, torch.ones(100)) - 1.0
        res["bound"] = st.last_error_bound
    finally:
        with open(os.path.join(outdir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(res, f)
        dist.destroy_process_group()
    end_worker()


def _launch(tmp_path_factory, world, ranks_per_node, worker=_worker):
    outdir = str(tmp_path_factory.mktemp(f"world{world}"))
    method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if method == "forkserver":  # import once, not once per process (DDP imports torch._dynamo)
        preload = ["torch", "torch._dynamo", "tensorpress.distributed.comm_hooks"]
        mp.get_context(method).set_forkserver_preload(preload)
    mp.start_processes(  # a worker ended by a signal raises ProcessExitedException here
        worker,
        args=(world, free_port(), outdir, ranks_per_node),
        nprocs=world,
        start_method=method,
    )
    results = []
    for r in range(world):
        with open(os.path.join(outdir, f"{r}.pkl"), "rb") as f:
            results.append(pickle.load(f))
    return results


# world size -> ranks_per_node: one level with 2 ranks, two levels (2 nodes of 2) with 4
CASES = {2: None, 4: 2}


@pytest.fixture(scope="module", params=sorted(CASES), ids=lambda w: f"world{w}")
def run(request, tmp_path_factory):
    world = request.param
    return world, CASES[world], _launch(tmp_path_factory, world, CASES[world])


@pytest.mark.parametrize("kind", ["random", "outliers"])
@pytest.mark.parametrize("hadamard", [False, True])
def test_result_within_composed_quantization_bound(run, kind, hadamard):
    _, _, results = run
    for r in results:
        m = r["bound", kind, hadamard]
        assert m["excess"] <= 0.0
        assert 0.0 < m["rms"] < m["bound_max"]


def test_bf16_bucket_is_returned_in_bf16_within_bound(run):
    for r in run[2]:
        assert r["bound", "bf16"]["excess"] <= 0.0


def test_non_default_process_group(run):
    for r in run[2]:
        assert r["bound", "own group"]["excess"] <= 0.0
        assert r["bound", "own group"]["bytes"] == r["bound", "random", True]["bytes"]


def test_hadamard_lowers_error_on_outliers(run):
    for r in run[2]:
        assert r["bound", "outliers", True]["rms"] < 0.8 * r["bound", "outliers", False]["rms"]


def test_error_feedback_keeps_the_running_sum_bounded(run):
    for r in run[2]:
        with_ef, without = r["feedback", True], r["feedback", False]
        assert with_ef["steps"] == without["steps"] == STEPS
        # with feedback the running error never exceeds one step's bound
        assert with_ef["excess"] <= 0.0
        # without, a repeating gradient's error repeats: the drift grows with the steps
        assert without["excess"] > 0.0
        assert without["drift"] > 5 * with_ef["drift"]


def test_bytes_sent_match_the_formula(run):
    world, rpn, results = run
    expected = hook_wire_nbytes(N, world, rpn, bits=4, intra_bits=8, group=128)
    for r in results:
        m = r["bound", "random", False]
        # quantized_allreduce checks the sizes: 8 bytes to each other rank
        assert m["calls"] == 1 and m["bytes"] == expected + (world - 1) * 8


def test_ddp_trains_with_the_hook(run):
    world, rpn, results = run
    for r in results:
        m = r["ddp"]
        assert m["last"] < 0.3 * m["first"]
        assert m["replicas_equal"]
        assert m["buckets"] == [(0, m["nparams"])] * 30  # one bucket per step
        assert m["calls"] == m["steps"] == 30
        # sizes checked at the first call and again after DDP rebuilt (reordered) the
        # bucket at the second step: 2 of the 30 calls
        assert m["size_checks"] == 2
        checked = (world - 1) * 8 * m["size_checks"]
        assert m["bytes"] == 30 * hook_wire_nbytes(m["nparams"], world, rpn) + checked


def test_ddp_with_several_buckets(run):
    world, rpn, results = run
    for r in results:
        m = r["buckets"]
        assert m["replicas_equal"] and m["steps"] == 3
        sizes = [n for _, n in m["buckets"]]
        assert m["calls"] == len(sizes) > 3 and sum(sizes) == 3 * m["nparams"]
        # sizes checked at each bucket's first call: one before the rebuild, two after
        assert m["size_checks"] == 3
        checked = (world - 1) * 8 * m["size_checks"]
        assert m["bytes"] == sum(hook_wire_nbytes(n, world, rpn) for n in sizes) + checked
        # one error-feedback residual per bucket index
        assert m["residual_keys"] == sorted({i for i, _ in m["buckets"]})
        assert m["cleared"] == (0, ())


def test_nonfinite_values_come_back_where_plain_allreduce_has_them(run):
    for r in run[2]:
        for hadamard in (False, True):
            steps = r["nonfinite", hadamard]
            # step 1: NaN at 5 and 301 (+Inf + -Inf), +Inf at 300 and 2999, -Inf at 1000
            assert [m["nonfinite"] for m in steps] == [0, 5, 0, 0]
            for m in steps:
                assert m["same_nonfinite"] and m["bound_finite"]
                # finite outputs, the rest of each non-finite value's group included, and
                # the steps after it stay within the quantization bound of plain all-reduce
                assert m["excess"] <= 0.0


def test_training_recovers_after_a_skipped_step_like_plain_ddp(run):
    for r in run[2]:
        plain, hooked = r["scaler", False], r["scaler", True]
        # the scaler skips the poisoned step and only it, with the hook as without
        assert plain["skipped"] == hooked["skipped"] == [4]
        assert hooked["finite"]
        assert hooked["losses"][-1] < 0.5 * hooked["losses"][0]
        assert hooked["losses"][-1] < 1.1 * plain["losses"][-1]


def test_mismatched_sizes_raise_on_every_rank(tmp_path_factory):
    results = _launch(tmp_path_factory, 2, None, _mismatch_worker)
    for r in results:
        assert "same number of values on every rank, got [100, 150]" in r["error"]
        # the group stays usable: the next call agrees
        assert (r["after"].abs() <= r["bound"] + 1e-6).all()


def test_single_rank_group_scale_is_that_of_the_finite_values(single_rank_group):
    st = QuantizedAllReduceState(hadamard=False, error_feedback=False, record_error_bound=True)
    x = torch.linspace(5.0, 6.0, 256)
    x[3], x[200] = math.inf, math.nan
    out = quantized_allreduce(st, x)
    assert out[3] == math.inf and out[200].isnan()
    fin = x.isfinite()
    assert ((out - x).abs()[fin] <= st.last_error_bound[fin] + 1e-6).all()
    # both stages quantize a group over its finite range: bound <= 2 * (range / 15) / 2
    for g in (slice(0, 128), slice(128, 256)):
        span = x[g][fin[g]].max() - x[g][fin[g]].min()
        assert (st.last_error_bound[g] <= span / 15 * (1 + 1e-4)).all()


def test_single_rank_group_overflowing_float32_is_nan_and_leaves_no_residual(single_rank_group):
    st = QuantizedAllReduceState(record_error_bound=True)  # Hadamard, error feedback
    x = torch.randn(512, generator=torch.Generator().manual_seed(1))
    x[130], x[131] = 3e38, -3e38  # the group's range exceeds float32's
    out = quantized_allreduce(st, x.clone())
    assert out[128:256].isnan().all()
    assert out[:128].isfinite().all() and out[256:].isfinite().all()
    before = st.last_error_bound
    y = torch.randn(512, generator=torch.Generator().manual_seed(2))
    out = quantized_allreduce(st, y)
    assert ((out - y).abs() <= st.last_error_bound + before + 1e-5).all()


def test_formula_by_hand():
    # one level, 2 ranks, 4 bits: shards of 1536 values = 768 code bytes + 12 groups * 8,
    # plus 1 flag byte to the other rank
    s = shard_size(N, 2, 128)
    assert s == 1536 and wire_nbytes(s, 4, 128) == 768 + 96
    assert hook_wire_nbytes(N, 2) == (1 + 1) * (768 + 96) + 1
    # two levels, 4 ranks as 2 nodes of 2: shards of 768 values, chunks of 1536 at 8 bits
    s = shard_size(N, 4, 128)
    assert s == 768
    intra = wire_nbytes(2 * s, 8, 128)
    inter = wire_nbytes(s, 4, 128)
    assert hook_wire_nbytes(N, 4, 2) == intra + (1 + 3) * inter + 3
    # 4 bits in groups of 128 send over 6x fewer bytes than a float32 ring all-reduce
    n = 1 << 22
    assert ring_allreduce_nbytes(n, 8) > 6 * hook_wire_nbytes(n, 8)


@pytest.fixture
def single_rank_group():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"bits": 3}, "bits must be 2, 4 or 8"),
        ({"intra_bits": 16}, "intra_bits must be 2, 4 or 8"),
        ({"group": 100}, "power of two"),
        ({"group": 0, "hadamard": False}, "group must be a positive"),
        ({"ranks_per_node": 2}, "not divisible by ranks_per_node"),
        ({"ranks_per_node": 0}, "ranks_per_node must be a positive"),
        ({"seed": 2**31}, "seed must be in"),
        ({"error_feedback": "yes"}, "error_feedback must be true or false"),
    ],
)
def test_construction_errors(single_rank_group, kwargs, match):
    with pytest.raises(ValueError, match=match):
        QuantizedAllReduceState(**kwargs)


def test_needs_an_initialized_process_group():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        QuantizedAllReduceState()


def test_single_rank_state_pickles_and_quantizes(single_rank_group):
    st = QuantizedAllReduceState(bits=8, group=64, error_feedback=False, record_error_bound=True)
    x = torch.randn(1000)
    out = quantized_allreduce(st, x)
    assert ((out - x).abs() <= st.last_error_bound + 1e-5).all()
    assert st.bytes_sent == 0 == hook_wire_nbytes(1000, 1, bits=8, group=64)
    assert quantized_allreduce(st, torch.empty(0, 3)).shape == (0, 3)
    back = pickle.loads(pickle.dumps(st))
    assert (back.bits, back.group, back.bytes_sent) == (8, 64, 0)
    with pytest.raises(ValueError, match="float tensor"):
        quantized_allreduce(st, torch.arange(10))
