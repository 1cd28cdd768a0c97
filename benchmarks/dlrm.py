"""Embedding all-to-all compression in a small DLRM, side by side.

A DLRM in plain PyTorch: a bottom MLP (13 -> 64 -> 16) over the dense features, 26
embedding tables of width 16 (sum-pooled bags) sharded table-wise over ``--world``
gloo processes on this machine (one torch thread each), dot-product interaction of
the 27 vectors, a top MLP (367 -> 64 -> 1). MLP gradients are averaged with a plain
all-reduce (the same for every variant); each table's owner updates it (Adagrad,
MLPs Adam). Every variant starts from the same weights (seed 0) and sees the same
batches.

Data: synthetic click logs, fixed seed, shaped like Criteo: 13 log-normal dense
features (log1p, standardised), 26 categorical features whose ids follow a Zipf law
(exponent 1.05) over tables of 40 to 20000 rows; labels drawn from a hidden model
(dense weights, per-id effects on 13 of the features, one pairwise interaction,
about 25% clicks), so AUC means something. Every rank draws the whole global batch
(so the id exchange before the lookup is left out: the same for every variant).

Variants of the pooled-embedding all-to-all (forward values, backward gradients):

  fp32          plain ``all_to_all_single`` of float32 rows
  fp16, bf16    cast both ways, as torchrec's QComms do
  fp8           e4m3 values with a float32 scale per row (amax / 448), both ways
  tp rel r      ``EmbeddingAllToAll``, ``block`` codec, rel bound r of each block's range
  tp adaptive r the same with ``AdaptiveBounds`` (per table and per step)

Reported per variant: bytes one rank sends per step (forward + backward, to the other
ranks, headers included) and their ratio to fp32; compression seconds per step
(casting, or compressing + decompressing); median step time relative to fp32; AUC
and log-loss on 16384 held-out samples after the same number of steps; and, as a
**model** (bytes / bandwidth, no latency), the all-to-all time per step on a link of
25 and of 100 GB/s.

    python benchmarks/dlrm.py --world 2            # every variant, 300 steps (4 min)
    python benchmarks/dlrm.py --world 4 --variants fp32 fp16 bf16 fp8 "tp rel 0.03" \
        "tp rel 0.06" "tp adaptive 0.03"           # (5 min on 2 shared vCPUs)
    python benchmarks/dlrm.py --world 2 --steps 30 # smoke run
    python benchmarks/dlrm.py --markdown           # the table for RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NDENSE, NCAT, DIM = 13, 26, 16
TABLE_ROWS = [int(40 * (20000 / 40) ** (i / (NCAT - 1))) for i in range(NCAT)]
TEST = 16384
WARM = 5  # steps left out of the byte and time averages


# -- synthetic click logs ------------------------------------------------------------------


class ClickLogs:
    """Criteo-like samples from a hidden model; ``batch(i, n)`` is deterministic."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.seed = seed
        self.zipf = [self._zipf(n, g) for n in TABLE_ROWS]
        self.perm = [torch.randperm(n, generator=g) for n in TABLE_ROWS]
        self.dense_w = torch.randn(NDENSE, generator=g) * 0.3
        scale = torch.zeros(NCAT)
        scale[::2] = torch.linspace(1.2, 0.2, 13)  # 13 informative features, 13 of noise
        self.effects = [
            torch.randn(n, generator=g) * s for n, s in zip(TABLE_ROWS, scale, strict=True)
        ]
        self.u = torch.randn(TABLE_ROWS[3], 4, generator=g) * 0.6
        self.v = torch.randn(TABLE_ROWS[7], 4, generator=g) * 0.6

    @staticmethod
    def _zipf(n, g):
        p = 1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** 1.05
        return p / p.sum()

    def batch(self, index: int, n: int):
        """(dense [n, 13], ids [n, 26], labels [n]) of batch ``index``."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        raw = torch.exp(torch.randn(n, NDENSE, generator=g) * 1.5)
        dense = (torch.log1p(raw) - 1.2) / 1.0
        ranks = [torch.multinomial(p, n, True, generator=g) for p in self.zipf]
        ids = torch.stack([perm[r] for perm, r in zip(self.perm, ranks, strict=True)], 1)
        logit = dense @ self.dense_w - 1.4
        logit += sum(e[ids[:, f]] for f, e in enumerate(self.effects))
        logit += (self.u[ids[:, 3]] * self.v[ids[:, 7]]).sum(1)
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        return dense, ids, labels


# -- the model --------------------------------------------------------------------------------


def _mlp(*widths):
    layers = []
    for a, b in zip(widths[:-1], widths[1:], strict=False):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class DLRM(torch.nn.Module):
    """Bottom MLP, this rank's tables, dot interaction, top MLP."""

    def __init__(self, tables):
        super().__init__()
        torch.manual_seed(0)
        self.bottom = _mlp(NDENSE, 64, DIM)
        every = [torch.nn.EmbeddingBag(n, DIM, mode="sum") for n in TABLE_ROWS]
        for e in every:
            torch.nn.init.uniform_(e.weight, -0.05, 0.05)
        self.tables = list(tables)
        self.emb = torch.nn.ModuleList(every[t] for t in self.tables)
        npairs = (NCAT + 1) * NCAT // 2
        self.top = _mlp(DIM + npairs, 64, 1)
        self.pairs = torch.triu_indices(NCAT + 1, NCAT + 1, 1)

    def pooled(self, ids):
        """float32 [rows, own tables, DIM]: one id per bag (Criteo's categorical features)."""
        if not self.tables:
            return torch.zeros(ids.shape[0], 0, DIM)
        return torch.stack(
            [e(ids[:, t : t + 1]) for e, t in zip(self.emb, self.tables, strict=True)], 1
        )

    def head(self, dense, emb):
        """Logits [rows] from dense features and all tables' pooled values [rows, 26, DIM]."""
        x = self.bottom(dense)
        vecs = torch.cat([x[:, None], emb], 1)
        dots = torch.bmm(vecs, vecs.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], 1)).squeeze(1)


# -- the all-to-all variants ---------------------------------------------------------------------


class CastAllToAll(torch.autograd.Function):
    """Table-wise all-to-all of ``cast``-encoded rows with ``all_to_all_single`` (uint8)."""

    @staticmethod
    def forward(ctx, pooled, ex, sizes):
        ctx.ex, ctx.sizes = ex, sizes
        return ex.move(pooled, sizes, forward=True)

    @staticmethod
    def backward(ctx, grad):
        return ctx.ex.move(grad, ctx.sizes, forward=False), None, None


class CastExchange:
    """fp32 / fp16 / bf16 / fp8 (e4m3, float32 scale per row) both ways."""

    def __init__(self, kind, counts):
        self.kind, self.counts = kind, counts
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.bytes = 0
        self.codec_seconds = 0.0

    def _encode(self, x):
        """uint8 [rows, bytes per row] of float32 rows [rows, values]."""
        if self.kind == "fp8":
            scale = (x.abs().amax(1, keepdim=True) / 448.0).clamp_min(1e-30)
            q = (x / scale).to(torch.float8_e4m3fn).view(torch.uint8)
            return torch.cat([q, scale.view(torch.uint8)], 1)
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.kind]
        return x.to(dtype).contiguous().view(torch.uint8)

    def _decode(self, b, m):
        if self.kind == "fp8":
            q = b[:, :m].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
            return q * b[:, m:].contiguous().view(torch.float32)
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.kind]
        return b.contiguous().view(dtype).to(torch.float32)

    def move(self, x, sizes, forward):
        t0 = time.perf_counter()
        if forward:  # [global rows, own tables, D] -> [own rows, all tables, D]
            parts = [p.reshape(p.shape[0], -1) for p in x.split(sizes)]
            cols = [c * DIM for c in self.counts]
            rows_in = [sizes[self.rank]] * self.world
        else:  # [own rows, all tables, D] -> [global rows, own tables, D]
            parts = [p.reshape(p.shape[0], -1) for p in x.split(self.counts, 1)]
            cols = [self.counts[self.rank] * DIM] * self.world
            rows_in = list(sizes)
        enc = [self._encode(p.contiguous()) for p in parts]
        width = [self._encode(torch.zeros(1, c)).shape[1] for c in cols]
        t1 = time.perf_counter()
        send = torch.cat([e.reshape(-1) for e in enc])
        out_splits = [r * w for r, w in zip(rows_in, width, strict=True)]
        recv = torch.empty(sum(out_splits), dtype=torch.uint8)
        dist.all_to_all_single(recv, send, out_splits, [e.numel() for e in enc])
        t2 = time.perf_counter()
        self.bytes += sum(e.numel() for r, e in enumerate(enc) if r != self.rank)
        dec = [self._decode(b.view(r, w), c) for b, r, w, c in
               zip(recv.split(out_splits), rows_in, width, cols, strict=True)]  # fmt: skip
        if forward:
            out = torch.cat([d.view(d.shape[0], -1, DIM) for d in dec], 1)
        else:
            out = torch.cat([d.view(d.shape[0], -1, DIM) for d in dec], 0)
        self.codec_seconds += (t1 - t0) + (time.perf_counter() - t2)
        return out


def _exchanger(variant, counts):
    """(call(pooled, sizes) -> tensor, bytes(), codec_seconds(), adaptive or None)."""
    from tensorpress.distributed.adaptive_bounds import AdaptiveBounds
    from tensorpress.distributed.embedding_a2a import EmbeddingAllToAll

    if not variant.startswith("tp"):
        ex = CastExchange(variant, counts)
        return (
            (lambda p, s: CastAllToAll.apply(p, ex, s)),
            (lambda: ex.bytes),
            (lambda: ex.codec_seconds),
            None,
        )
    rel = float(variant.split()[-1])
    adaptive = AdaptiveBounds(NCAT, warmup=30) if "adaptive" in variant else None
    codec = {"id": "block", "rel": rel}
    a2a = EmbeddingAllToAll(counts, DIM, forward=codec, backward=codec, adaptive=adaptive)
    stats = (a2a.forward_stats, a2a.backward_stats)
    return (
        (lambda p, s: a2a(p, s)),
        (lambda: sum(st.bytes_sent for st in stats)),
        (lambda: sum(st.codec_seconds for st in stats)),
        adaptive,
    )


# -- training and evaluation ----------------------------------------------------------------------


def _counts(world):
    return [NCAT // world + (r < NCAT % world) for r in range(world)]


def _train(variant, args, logs):
    rank, world = dist.get_rank(), dist.get_world_size()
    counts = _counts(world)
    first = sum(counts[:rank])
    model = DLRM(range(first, first + counts[rank]))
    dense_params = [*model.bottom.parameters(), *model.top.parameters()]
    opt = torch.optim.Adam(dense_params, lr=2e-3)
    opt_emb = torch.optim.Adagrad(model.emb.parameters(), lr=0.05) if counts[rank] else None
    call, nbytes, codec_s, adaptive = _exchanger(variant, counts)
    local = args.batch // world
    sizes = [local] * world
    times = []
    for step in range(args.steps):
        if step == WARM:  # leave out first calls (numba compiles the codec's kernels)
            at_warm = (nbytes(), codec_s())
        dense, ids, labels = logs.batch(step, args.batch)
        t0 = time.perf_counter()
        mine = slice(rank * local, (rank + 1) * local)
        emb = call(model.pooled(ids), sizes)
        logits = model.head(dense[mine], emb)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[mine])
        opt.zero_grad()
        if opt_emb:
            opt_emb.zero_grad()
        (loss / world).backward()
        flat = torch.cat([p.grad.reshape(-1) for p in dense_params] + [loss.detach()[None]])
        dist.all_reduce(flat)
        at = 0
        for p in dense_params:
            p.grad.copy_(flat[at : at + p.numel()].view_as(p) / world)
            at += p.numel()
        opt.step()
        if opt_emb:
            opt_emb.step()
        if adaptive is not None:
            adaptive.step(flat[-1].item() / world)
        times.append(time.perf_counter() - t0)
    auc, logloss = _evaluate(model, logs, args.batch)
    return {
        "bytes": (nbytes() - at_warm[0]) / (args.steps - WARM),
        "codec_s": (codec_s() - at_warm[1]) / (args.steps - WARM),
        "step_s": statistics.median(times[WARM:]),
        "auc": auc,
        "logloss": logloss,
        "factor": adaptive.factor if adaptive is not None else None,
    }


@torch.no_grad()
def _evaluate(model, logs, batch):
    """AUC and log-loss over the held-out samples, exchanged in float32."""
    rank, world = dist.get_rank(), dist.get_world_size()
    counts = _counts(world)
    ex = CastExchange("fp32", counts)
    dense, ids, labels = logs.batch(-1, TEST)
    preds = []
    local = batch // world
    for at in range(0, TEST, batch):
        mine = slice(at + rank * local, at + (rank + 1) * local)
        emb = ex.move(model.pooled(ids[at : at + batch]), [local] * world, forward=True)
        preds.append(model.head(dense[mine], emb))
    mine = torch.cat(preds)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    logits = torch.stack([torch.stack(e.split(local)) for e in every], 1).reshape(-1)
    return _auc(logits, labels[: logits.numel()]), _logloss(logits, labels[: logits.numel()])


def _auc(scores, labels) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties averaged)."""
    order = scores.double().argsort()
    ranks = torch.empty_like(order, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    _, inverse = torch.unique(scores, return_inverse=True)
    sums = torch.zeros(inverse.max() + 1, dtype=torch.float64).index_add_(0, inverse, ranks)
    counts = torch.bincount(inverse).double()
    ranks = (sums / counts)[inverse]
    pos = labels.bool()
    npos, nneg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def _logloss(logits, labels) -> float:
    return float(
        torch.nn.functional.binary_cross_entropy_with_logits(logits.double(), labels.double())
    )


# -- the launcher --------------------------------------------------------------------------------


def _worker(rank, world, port, outdir, args):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    torch.set_num_threads(1)
    logs = ClickLogs()
    res = {v: _train(v, args, logs) for v in args.variants}
    with open(os.path.join(outdir, f"{rank}.pkl"), "wb") as f:
        pickle.dump(res, f)
    dist.destroy_process_group()
    os._exit(0)  # see tests/dist_workers.end_worker: gloo's teardown may abort


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, args) -> dict:
    """Per variant: the mean over ranks of bytes and seconds, rank 0's AUC and log-loss."""
    with tempfile.TemporaryDirectory() as outdir:
        mp.start_processes(_worker, args=(world, _free_port(), outdir, args), nprocs=world,
                           start_method="spawn")  # fmt: skip
        ranks = []
        for r in range(world):
            with open(os.path.join(outdir, f"{r}.pkl"), "rb") as f:
                ranks.append(pickle.load(f))
    out = {}
    for v in args.variants:
        per = [r[v] for r in ranks]
        out[v] = {k: statistics.mean(p[k] for p in per) for k in ("bytes", "codec_s", "step_s")}
        out[v].update(auc=per[0]["auc"], logloss=per[0]["logloss"], factor=per[0]["factor"])
    return out


def _table(world, res, args) -> str:
    base = res["fp32"]
    head = (
        "| variant | bytes/step | vs fp32 | codec ms/step | step time | AUC | ΔAUC "
        "| log-loss | Δ log-loss | model 25 GB/s | model 100 GB/s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for v, m in res.items():
        rows.append(
            f"| {v} | {m['bytes'] / 1024:.1f} KiB | {base['bytes'] / m['bytes']:.2f}x "
            f"| {1e3 * m['codec_s']:.2f} | {m['step_s'] / base['step_s']:.2f}x "
            f"| {m['auc']:.4f} | {m['auc'] - base['auc']:+.4f} | {m['logloss']:.4f} "
            f"| {100 * (m['logloss'] / base['logloss'] - 1):+.2f}% "
            f"| {1e6 * m['bytes'] / 25e9:.2f} us | {1e6 * m['bytes'] / 100e9:.2f} us |"
        )
    title = f"{world} processes, {args.steps} steps, global batch {args.batch}"
    return f"{title}\n\n{head}" + "\n".join(rows)


DEFAULT_VARIANTS = [
    "fp32", "fp16", "bf16", "fp8",
    "tp rel 0.01", "tp rel 0.03", "tp rel 0.06",
    "tp adaptive 0.03", "tp adaptive 0.06",
]  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=512, help="global batch (samples)")
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS)
    ap.add_argument("--markdown", action="store_true", help="print the tables only")
    args = ap.parse_args(argv)
    if args.steps <= WARM:
        ap.error(f"--steps must be above {WARM}")
    if "fp32" not in args.variants:
        args.variants.insert(0, "fp32")
    for world in args.world:
        t0 = time.perf_counter()
        res = launch(world, args)
        print(_table(world, res, args))
        if not args.markdown:
            factors = {v: m["factor"] for v, m in res.items() if m["factor"] is not None}
            print(f"({time.perf_counter() - t0:.0f} s; final step factors {factors})")
        print()
    if not args.markdown:
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
        print("model: all-to-all time = bytes one rank sends per step / link bandwidth")


if __name__ == "__main__":
    main()
