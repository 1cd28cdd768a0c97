"""Gradient- and weight-communication benchmark: DDP hooks and ZeRO-style qWD, side by side.

Trains the byte-level LM of ``activations.py`` (``ByteLM(blocks=2, dim=96, heads=4)``,
context 128, on the first 2 MB of the Python standard library's ``*.py`` files) with
``--world`` processes on this machine (gloo, one torch thread each), the same initial
weights (seed 0) and the same batches for every variant: each step draws a global batch
of ``world * 16`` windows and rank r trains on its slice. AdamW (lr 3e-3, weight decay
0.01), decayed linearly to 0 over the run. DDP variants, one per communication hook:

  (a) all-reduce      ``default_hooks.allreduce_hook`` (plain float32 all-reduce)
  (b) fp16            ``default_hooks.fp16_compress_hook``
  (c) PowerSGD        ``powerSGD_hook``, rank 2, ``start_powerSGD_iter=10`` (float32
                      all-reduce for the first 10 steps), error feedback and warm start
  (d) tp 8-bit        ``quantized_allreduce_hook``, 8 bits in both stages, groups of 128,
                      no Hadamard, no error feedback
  (e) tp 4-bit TLq-HS ``quantized_allreduce_hook``, 8 bits within a node, 4 bits across
                      nodes, groups of 128, Hadamard and error feedback

``--ranks-per-node`` (default 1) tells the tensorpress hooks how many consecutive ranks
share a node; all processes run on one machine, so with 1 every rank is its own "node"
and the 4-bit inter-node stage carries all the traffic (the 8-bit intra-node stage is
exercised only with ``--world 4 --ranks-per-node 2``).

Then the ZeRO-style loop (``ShardedOptimizer``: float32 gradients reduce-scattered
with ``all_to_all_single``, each rank steps its AdamW shard, weights all-gathered):

  zero fp32   weights all-gathered in float32
  zero qWD    ``WeightDiffQuantizer``: 4-bit weight differences, groups of 2048,
              a float32 refresh every 100 steps (and at step 0)

Bytes are what one rank sends to the other ranks per step, averaged over the run: for
(a)-(c) a ring all-reduce of each tensor the torch hooks pass to
``torch.distributed.all_reduce`` (``2 * (world - 1) * ceil(n / world) * itemsize``,
counted by wrapping it), ``state.bytes_sent / state.steps`` for (d)-(e) (the quantized
reduce-scatter and all-gather payloads), and the optimizer's gradient and weight
counters for the ZeRO loop (``world - 1`` pieces and shard copies). Losses: training loss =
mean over ranks of the last 20 steps' batch losses; validation loss = mean cross-entropy
(nats/byte) over 20 fixed held-out batches. Step time = median wall time of a step on
rank 0 after 3 warm-ups, relative to (a) (or to zero fp32). Targets: (e) bytes <= 1/6 of
(a) and validation loss at most 2% above (a); qWD weight bytes <= 1/6 of zero fp32 and
validation loss at most 2% above zero fp32.

    python benchmarks/gradients.py                 # 2 processes, 300 steps (13 min, 2 vCPUs)
    python benchmarks/gradients.py --steps 30      # smoke run
    python benchmarks/gradients.py --world 4 --ranks-per-node 2
    python benchmarks/gradients.py --markdown      # tables for RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    from activations import ByteLM, lm_task
    from compressors import Table
    from compressors import fmt_cell as _fmt
    from compressors import ratio_or_none as _ratio
except ImportError:  # imported as benchmarks.gradients
    from benchmarks.activations import ByteLM, lm_task
    from benchmarks.compressors import Table
    from benchmarks.compressors import fmt_cell as _fmt
    from benchmarks.compressors import ratio_or_none as _ratio

SEED = 0
DEFAULT_STEPS = 300
WARMUP = 3
RANK_BATCH = 16  # windows of 128 bytes per rank per step
VAL_BATCHES = 20
TRAIN_TAIL = 20  # training loss = mean of this many last steps
LR, WEIGHT_DECAY = 3e-3, 0.01
MODEL = {"blocks": 2, "dim": 96, "heads": 4}
POWERSGD = {"matrix_approximation_rank": 2, "start_powerSGD_iter": 10}
QWD = {"bits": 4, "group": 2048, "refresh_every": 100}
TARGET_BYTES = 1 / 6
TARGET_LOSS_PCT = 2.0
PLAIN, FP16, POWERSGD_ROW, TP8, TP4 = (
    "(a) all-reduce",
    "(b) fp16",
    "(c) PowerSGD r2",
    "(d) tp 8-bit",
    "(e) tp 4-bit TLq-HS",
)
ZERO_FP32, ZERO_QWD = "zero fp32", "zero qWD 4-bit"
DDP_VARIANTS = (PLAIN, FP16, POWERSGD_ROW, TP8, TP4)


@dataclass
class Result:
    variant: str
    train_loss: float | None = None
    val_loss: float | None = None
    bytes_per_step: float | None = None  # gradient bytes (DDP) / weight bytes (ZeRO)
    grad_bytes_per_step: float | None = None  # ZeRO only
    step_s: float | None = None
    note: str = ""


# --------------------------------------------------------------------------- hooks


class _AllReduceCounter:
    """Counts, while ``active``, the bytes a rank sends in each
    ``torch.distributed.all_reduce`` run as a ring (reduce-scatter + all-gather):
    ``2 * (world - 1) * ceil(n / world) * itemsize``, as ``comm_hooks.ring_allreduce_nbytes``."""

    def __init__(self, world: int):
        self.active, self.bytes = False, 0
        self._orig = dist.all_reduce

        def counting(tensor, *args, **kwargs):
            if self.active:
                self.bytes += 2 * (world - 1) * -(-tensor.numel() // world) * tensor.element_size()
            return self._orig(tensor, *args, **kwargs)

        dist.all_reduce = counting


def _hook_for(variant: str, ranks_per_node: int):
    """(state, hook, counted): ``counted`` if the all-reduce wrapper counts the hook's bytes,
    else ``state.bytes_sent`` does."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if variant == PLAIN:
        return None, default_hooks.allreduce_hook, True
    if variant == FP16:
        return None, default_hooks.fp16_compress_hook, True
    if variant == POWERSGD_ROW:
        state = powerSGD_hook.PowerSGDState(process_group=None, random_seed=SEED, **POWERSGD)
        return state, powerSGD_hook.powerSGD_hook, True
    from tensorpress.distributed.comm_hooks import QuantizedAllReduceState, quantized_allreduce_hook

    if variant == TP8:
        kwargs = {"bits": 8, "intra_bits": 8, "hadamard": False, "error_feedback": False}
    else:
        kwargs = {"bits": 4, "intra_bits": 8, "hadamard": True, "error_feedback": True}
    state = QuantizedAllReduceState(ranks_per_node=ranks_per_node, group=128, **kwargs)
    return state, quantized_allreduce_hook, False


# --------------------------------------------------------------------------- training


def _model() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return ByteLM(**MODEL)


def _train(task, model, zero_grad, step, optimizer, steps: int, rank: int):
    """Run ``steps`` steps (``zero_grad``, forward, backward, ``step``, lr schedule on
    ``optimizer``); returns (this rank's batch losses, step seconds)."""
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0 - i / steps)
    mine = slice(rank * RANK_BATCH, (rank + 1) * RANK_BATCH)
    losses, times = [], []
    model.train()
    for _, (x, y) in zip(range(steps), task.batches(), strict=False):
        t0 = time.perf_counter()
        zero_grad()
        loss = task.loss(model, x[mine], y[mine])
        loss.backward()
        step()
        sched.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def _finish(task, model, losses, times, res: Result, world: int) -> Result:
    tail = torch.tensor(statistics.fmean(losses[-TRAIN_TAIL:]))
    dist.all_reduce(tail)
    res.train_loss = tail.item() / world
    res.val_loss = task.evaluate(model)
    res.step_s = statistics.median(times[WARMUP:])
    return res


def _run_ddp(task, variant, steps, rank, world, ranks_per_node, counter) -> Result:
    from torch.nn.parallel import DistributedDataParallel as DDP

    state, hook, counted = _hook_for(variant, ranks_per_node)
    model = DDP(_model())
    model.register_comm_hook(state, hook)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    counter.bytes, counter.active = 0, counted
    try:
        losses, times = _train(task, model, opt.zero_grad, lambda: opt.step(), opt, steps, rank)
    finally:
        counter.active = False
    res = Result(variant)
    res.bytes_per_step = counter.bytes / steps if counted else state.bytes_sent / state.steps
    if variant == POWERSGD_ROW:
        res.note = f"float32 all-reduce for the first {POWERSGD['start_powerSGD_iter']} steps"
    return _finish(task, model.module, losses, times, res, world)


def _run_zero(task, variant, steps, rank, world) -> Result:
    from tensorpress.distributed.sharded_optimizer import ShardedOptimizer

    model = _model()
    quantizer = QWD if variant == ZERO_QWD else False
    opt = ShardedOptimizer(
        model.parameters(),
        lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=WEIGHT_DECAY),
        weight_quantizer=quantizer,
    )
    losses, times = _train(task, model, opt.zero_grad, opt.step, opt.optimizer, steps, rank)
    res = Result(variant)
    res.bytes_per_step = opt.weight_bytes / opt.steps
    res.grad_bytes_per_step = opt.grad_bytes / opt.steps
    return _finish(task, model, losses, times, res, world)


def _worker(rank: int, world: int, port: int, args: dict, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    counter = _AllReduceCounter(world)
    task = lm_task(torch.device("cpu"), VAL_BATCHES, batch=world * RANK_BATCH)
    results = []
    runs = [(v, "ddp") for v in DDP_VARIANTS] + [(ZERO_FP32, "zero"), (ZERO_QWD, "zero")]
    for variant, kind in runs:
        started = time.perf_counter()
        try:
            if kind == "ddp":
                res = _run_ddp(task, variant, args["steps"], rank, world, args["rpn"], counter)
            else:
                res = _run_zero(task, variant, args["steps"], rank, world)
        except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the run
            res = Result(variant, note=f"!! {type(exc).__name__}: {exc}")
        if rank == 0:
            print(f"  {variant}: {time.perf_counter() - started:.0f} s", flush=True)
        results.append(asdict(res))
    if rank == 0:
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


# --------------------------------------------------------------------------- printing


def _pct(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else 100.0 * (value - base) / base


def print_tables(results: list[Result], title: str, markdown: bool) -> None:
    by_name = {r.variant: r for r in results}
    base = by_name[PLAIN]
    table = Table(
        f"DDP gradient all-reduce: {title}",
        [
            ("variant", 19, "<"),
            ("train loss", 10, ">"),
            ("val loss", 8, ">"),
            ("val delta %", 11, ">"),
            ("KiB/step", 8, ">"),
            ("bytes vs (a)", 12, ">"),
            ("step ms", 7, ">"),
            ("step time vs (a)", 16, ">"),
            ("note", 4, "<"),
        ],
        markdown,
    )
    table.header()
    for r in (by_name[v] for v in DDP_VARIANTS):
        table.row(
            r.variant,
            _fmt(r.train_loss, ".4f"),
            _fmt(r.val_loss, ".4f"),
            _fmt(_pct(r.val_loss, base.val_loss), "+.2f"),
            _fmt(_ratio(r.bytes_per_step, 1024), ".1f"),
            _fmt(_ratio(r.bytes_per_step, base.bytes_per_step), ".3f"),
            _fmt(None if r.step_s is None else 1e3 * r.step_s, ".0f"),
            _fmt(_ratio(r.step_s, base.step_s), ".2f", "x"),
            r.note,
        )
    zero = by_name[ZERO_FP32]
    table = Table(
        f"ZeRO-style sharded AdamW, weight all-gather: {title}",
        [
            ("variant", 19, "<"),
            ("train loss", 10, ">"),
            ("val loss", 8, ">"),
            ("val delta %", 11, ">"),
            ("weight KiB/step", 15, ">"),
            ("weight vs fp32", 14, ">"),
            ("grad KiB/step", 13, ">"),
            ("step ms", 7, ">"),
            ("step time vs fp32", 17, ">"),
            ("note", 4, "<"),
        ],
        markdown,
    )
    table.header()
    for r in (by_name[v] for v in (ZERO_FP32, ZERO_QWD)):
        table.row(
            r.variant,
            _fmt(r.train_loss, ".4f"),
            _fmt(r.val_loss, ".4f"),
            _fmt(_pct(r.val_loss, zero.val_loss), "+.2f"),
            _fmt(_ratio(r.bytes_per_step, 1024), ".1f"),
            _fmt(_ratio(r.bytes_per_step, zero.bytes_per_step), ".3f"),
            _fmt(_ratio(r.grad_bytes_per_step, 1024), ".1f"),
            _fmt(None if r.step_s is None else 1e3 * r.step_s, ".0f"),
            _fmt(_ratio(r.step_s, zero.step_s), ".2f", "x"),
            r.note,
        )


def _target_line(name: str, r: Result, base: Result, what: str) -> str:
    if r.val_loss is None or base.val_loss is None:
        return f"{name} targets: NOT MET (no result: {r.note or base.note})"
    frac = r.bytes_per_step / base.bytes_per_step
    loss = _pct(r.val_loss, base.val_loss)
    checks = [
        (frac <= TARGET_BYTES, f"{what} {frac:.3f} of {base.variant} (<= 1/6 = 0.167)"),
        (loss <= TARGET_LOSS_PCT, f"val loss {loss:+.2f}% vs {base.variant} (<= +2%)"),
    ]
    text = "; ".join(f"{w} {'MET' if ok else 'NOT MET'}" for ok, w in checks)
    return f"{name} targets: {text}"


def print_targets(results: list[Result]) -> None:
    by_name = {r.variant: r for r in results}
    print()
    print(_target_line(TP4, by_name[TP4], by_name[PLAIN], "bytes/step"))
    print(_target_line(ZERO_QWD, by_name[ZERO_QWD], by_name[ZERO_FP32], "weight bytes/step"))


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train a byte-level LM with DDP communication hooks (plain, fp16, "
        "PowerSGD, tensorpress 8-bit and 4-bit) and a ZeRO-style loop with and without "
        "quantized weight differences."
    )
    p.add_argument(
        "--steps", type=int, default=DEFAULT_STEPS, help=f"steps per variant ({DEFAULT_STEPS})"
    )
    p.add_argument("--world", type=int, default=2, help="processes (default 2)")
    p.add_argument(
        "--ranks-per-node",
        type=int,
        default=1,
        help="consecutive ranks the tensorpress hooks treat as one node (default 1: the "
        "4-bit inter-node stage carries everything)",
    )
    p.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    args = p.parse_args(argv)
    if args.steps <= max(WARMUP, POWERSGD["start_powerSGD_iter"], TRAIN_TAIL):
        p.error(f"--steps must exceed {max(WARMUP, POWERSGD['start_powerSGD_iter'], TRAIN_TAIL)}")
    if args.world < 2:
        p.error("--world must be at least 2")
    if args.ranks_per_node < 1 or args.world % args.ranks_per_node:
        p.error("--ranks-per-node must be a positive divisor of --world")
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    params = sum(p.numel() for p in _model().parameters())
    print("Gradient/weight communication benchmark (KiB = 1024 bytes; seed 0 for every variant)")
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"gloo, {args.world} processes x 1 thread, ranks_per_node={args.ranks_per_node}"
    )
    print(
        f"ByteLM {MODEL}: {params} parameters ({params * 4 / 1024:.0f} KiB float32), "
        f"{args.steps} steps, {RANK_BATCH} x 128 bytes per rank per step",
        flush=True,
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        run_args = {"steps": args.steps, "rpn": args.ranks_per_node}
        mp.spawn(
            _worker,
            args=(args.world, _free_port(), run_args, out),
            nprocs=args.world,
            join=True,
        )
        with open(os.path.join(out, "results.json")) as f:
            results = [Result(**r) for r in json.load(f)]
    title = (
        f"{args.world} processes, ranks_per_node={args.ranks_per_node}, {args.steps} steps, "
        f"step time = median after {WARMUP} warm-ups"
    )
    print_tables(results, title, args.markdown)
    print_targets(results)
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
