"""Saved activations inside compiled graphs: a GPT-2-small-shaped byte-level LM scaled
to a small machine (6 layers, width 384, 6 heads, sequence 256), trained from one
initialisation on the same batches (this repository's own source text) by

- ``eager``: plain eager training;
- ``compile``: ``torch.compile(model)`` (inductor);
- ``compile+fp8``: inductor with PyTorch's own activation quantization pass
  (``post_grad_fusion_options["activation_quantization_aten_pass"]``: float32 saved
  tensors of at least 0.1 MB to float8_e5m2 with a scale); where it fails (no float8 on
  the device) the row says so;
- ``checkpoint``: ``torch.utils.checkpoint`` around each block (eager);
- ``tp eager``: ``ActivationCompression(codec="block", rel=...)``, the eager hooks;
- ``tp compiled``: ``compile_with_compression(model, rel=..., memory_budget=...)``.

Per variant: the activation bytes a step saves for backward (compiled: what the forward
graph returns for backward, each storage once, parameters and the batch left out, from
the partitioner; eager: the saved tensors' storages, from a counting hook pair; the
checkpoint: each block's input plus what the head saves), the most a step's resident
memory rises over its size before the step and the median step time (both after the
first three steps, which compile), and the validation loss after ``--steps`` steps.
The variants step in turn, one step each, so the machine's load falls on all alike.

Targets (CPU): ``tp compiled`` saves at least 8x fewer activation bytes than
``compile`` at no more than 1.3x its step time, with the validation loss within 1%.

    python benchmarks/compiled.py --steps 200
"""

from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from peak_memory import CODE  # noqa: E402

exec(CODE)  # reset_peak(), peak_bytes()

from tensorpress.activation_offload import ActivationCompression  # noqa: E402
from tensorpress.activation_offload.compiled import CompiledCompression  # noqa: E402

VOCAB = 256
#: ``tp compiled``'s ``memory_budget``: the partitioner recomputes cheap producers
#: (norms, GELU, attention) from the matmuls' outputs, which the codes then hold
BUDGET = 0.5


class Block(nn.Module):
    """A pre-LayerNorm GPT-2 block: causal softmax attention, GELU MLP."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.n1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.n2, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(self.n1(x)).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))


class GPT(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, seq: int, ckpt: bool = False):
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, d), nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, VOCAB)
        self.ckpt = ckpt

    def forward(self, idx, target):
        x = self.emb(idx) + self.pos
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.ckpt else block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def corpus(seq: int, batch: int, steps: int, val: int):
    """(training batches, validation batches) of byte windows of this repository's
    Python sources, the same for every variant."""
    text = b"".join(p.read_bytes() for p in sorted(ROOT.rglob("*.py")) if ".cache" not in str(p))
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(0)
    split = int(len(data) * 0.9)

    def draw(lo, hi, n):
        starts = torch.randint(lo, hi - seq - 1, (n, batch), generator=g)
        windows = [torch.stack([data[s : s + seq + 1] for s in row]) for row in starts]
        return [(w[:, :-1], w[:, 1:]) for w in windows]

    return draw(0, split, steps), draw(split, len(data), val)


class SavedCounter(torch.autograd.graph.saved_tensors_hooks):
    """Counts the storages eager autograd saves (parameters left out), in bytes."""

    def __init__(self, params):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.seen: dict = {}
        super().__init__(self._pack, lambda t: t)

    def _pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if t.is_floating_point() and ptr not in self.params:
            self.seen[ptr] = t.untyped_storage().nbytes()
        return t


class Variant:
    """A model, its optimizer and how one step runs; its measurements."""

    def __init__(self, name, model, step_fn):
        self.name, self.model, self.step_fn = name, model, step_fn
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.times, self.peaks, self.saved, self.held, self.error = [], [], None, None, None

    def step(self, idx, target):
        self.opt.zero_grad(set_to_none=True)
        cuda = idx.is_cuda
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if cuda else current_rss()
        reset_peak()  # noqa: F821  (from peak_memory.CODE)
        started = time.perf_counter()
        self.step_fn(self, idx, target)
        self.opt.step()
        if cuda:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - started)
        peak = torch.cuda.max_memory_allocated() if cuda else peak_bytes()  # noqa: F821
        self.peaks.append(peak - before)


def current_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(v.split()[1]) * 1024 for v in f if v.startswith("VmRSS:"))


def _eager(v, idx, target):
    counter = SavedCounter(v.model.parameters())
    with counter:
        loss = v.model(idx, target)
    loss.backward()
    v.saved = v.held = sum(counter.seen.values())


def _compiled(counting):
    def step(v, idx, target):
        v.compiled(idx, target).backward()
        graphs = counting.saved.graphs
        if graphs:
            v.saved, v.held = graphs[-1]["activations"], graphs[-1]["held"]

    return step


def _checkpointed(args):
    block_inputs = args.layers * args.batch * args.seq * args.width * 4

    def step(v, idx, target):
        _eager(v, idx, target)
        v.saved = v.held = v.saved + block_inputs

    return step


def _tp_eager(rel):
    def step(v, idx, target):
        ac = ActivationCompression(codec="block", rel=rel)
        with ac:
            loss = v.model(idx, target)
        loss.backward()
        v.saved, v.held = ac.stats.saved_bytes, ac.stats.stored_bytes

    return step


def _fp8_options() -> dict:
    quant = {"activation_quantization_aten_pass": {"allowed_dtypes": "torch.float32"}}
    quant["activation_quantization_aten_pass"] |= {"size_in_mb": 0.1, "use_scaling": True}
    return {"post_grad_fusion_options": quant}


def variants(args, init):
    def model(ckpt=False):
        m = GPT(args.layers, args.width, args.heads, args.seq, ckpt)
        m.load_state_dict(init)
        return m.to(args.device)

    out = [Variant("eager", model(), _eager)]
    for name, counting, options in (
        ("compile", CompiledCompression(rel=None), {}),
        ("compile+fp8", CompiledCompression(rel=None), _fp8_options()),
        ("tp compiled", CompiledCompression(rel=args.rel, memory_budget=args.budget), {}),
    ):
        v = Variant(name, model(), _compiled(counting))
        v.compiled = torch.compile(v.model, options={**options, **counting.options})
        out.append(v)
    out.append(Variant("checkpoint", model(ckpt=True), _checkpointed(args)))
    out.append(Variant("tp eager", model(), _tp_eager(args.rel)))
    return out


@torch.no_grad()
def val_loss(model, batches) -> float:
    model.eval()
    loss = statistics.fmean(float(model(i, t)) for i, t in batches)
    model.train()
    return loss


def train(args):
    torch.manual_seed(0)
    init = GPT(args.layers, args.width, args.heads, args.seq).state_dict()
    batches, val = corpus(args.seq, args.batch, args.steps, args.val_batches)
    batches = [(i.to(args.device), t.to(args.device)) for i, t in batches]
    val = [(i.to(args.device), t.to(args.device)) for i, t in val]
    runs = [v for v in variants(args, init) if not args.only or v.name in args.only]
    for i, (idx, target) in enumerate(batches):
        for v in runs:
            if v.error is None:
                try:
                    v.step(idx, target)
                except Exception as e:  # a variant the device cannot run: say so, go on
                    v.error = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        if (i + 1) % max(1, args.steps // 10) == 0:
            print(f"step {i + 1}/{args.steps}", flush=True)
    return runs, {v.name: val_loss(v.model, val) for v in runs if v.error is None}


def report(args, runs, losses) -> int:
    rows = {v.name: v for v in runs}
    base = rows.get("compile")
    median = {v.name: statistics.median(v.times[3:] or v.times) for v in runs if v.times}
    print(f"\n{args.layers} layers, width {args.width}, seq {args.seq}, batch {args.batch}, ")
    print(f"{args.steps} steps, rel {args.rel}, {args.device}, {torch.get_num_threads()} threads\n")
    print(
        "| variant | saved act. MB | held MB | vs compile | peak step MB | step s | "
        "vs compile | val loss |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for v in runs:
        if v.error is not None:
            print(f"| {v.name} | not run: {v.error} |||||||")
            continue
        red = base.saved / v.held if base and base.saved and v.held else math.nan
        slow = median[v.name] / median["compile"] if "compile" in median else math.nan
        print(
            f"| {v.name} | {v.saved / 1e6:.1f} | {v.held / 1e6:.1f} | {red:.2f}x | "
            f"{max(v.peaks[3:] or v.peaks) / 1e6:.0f} | {median[v.name]:.3f} | {slow:.2f}x | "
            f"{losses[v.name]:.4f} |"
        )
    return targets(rows, median, losses)


def targets(rows, median, losses) -> int:
    ours, base = rows.get("tp compiled"), rows.get("compile")
    if not ours or not base or ours.error or base.error:
        print("\ntargets: not measured (tp compiled or compile missing)")
        return 1
    checks = [
        ("saved bytes >= 8x fewer than compile", base.saved / ours.held, 8.0, ">="),
        ("step time <= 1.3x compile", median[ours.name] / median[base.name], 1.3, "<="),
        (
            "val loss within 1% of compile",
            abs(losses[ours.name] / losses[base.name] - 1),
            0.01,
            "<=",
        ),
    ]
    print()
    for text, value, bound, op in checks:
        met = value >= bound if op == ">=" else value <= bound
        print(f"{'MET' if met else 'NOT MET'}: {text} ({value:.3f} {op} {bound})")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--rel", type=float, default=1e-2)
    p.add_argument(
        "--budget", type=float, default=BUDGET, help="tp compiled's memory_budget (recompute)"
    )
    p.add_argument("--val-batches", type=int, default=4)
    p.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (peak: CUDA memory there)")
    args = p.parse_args(argv)
    runs, losses = train(args)
    return report(args, runs, losses)


if __name__ == "__main__":
    sys.exit(main())
