"""Stochastic against nearest rounding of compressed activations, on training curves.

Trains activations.py's byte-level transformer LM (its data, batches and optimizer;
smaller by default so that the CPU finishes in minutes) from the same initial weights
on the same batches, once per variant, in turns of 10 steps so that the shared
machine's load moves them alike:

  uncompressed                  plain training
  nearest rel=R                 ``ActivationCompression("block", rel=R)``
  stochastic rel=R              ``ActivationCompression("block", rel=R, stochastic=True,
                                seed=0)``: codes on a step half as wide, rounded up or
                                down with the probability that makes them unbiased

for each bound R in ``--rels``. Columns: reduction (saved / held bytes in the last
step), the validation loss (the first ``--val-batches`` of activations.py's fixed val
batches) at a quarter, half, three quarters and the end of the run, its change at the
end against uncompressed in %, and the median step time (leaving out each turn's first
step) over uncompressed's.

    python benchmarks/unbiased.py --markdown
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import torch
from activations import ByteLM, lm_task
from tensorpress.activation_offload import ActivationCompression

TURN = 10  # steps a variant runs before the next one takes over


def variants(rels: Sequence[float]) -> list[tuple[str, dict | None]]:
    out = [("uncompressed", None)]
    for rel in rels:
        out.append((f"nearest rel={rel:g}", {"rel": rel}))
        out.append((f"stochastic rel={rel:g}", {"rel": rel, "stochastic": True, "seed": 0}))
    return out


class Run:
    """One variant's model, optimizer, schedule, batches and measurements."""

    def __init__(self, task, name: str, settings: dict | None, args):
        torch.manual_seed(0)
        self.name, self.task = name, task
        self.model = ByteLM(blocks=args.blocks, dim=args.dim, heads=4, context=128)
        self.opt = task.make_optimizer(self.model)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: max(0.0, 1.0 - s / args.steps)
        )
        self.ac = None if settings is None else ActivationCompression("block", **settings)
        self.batches = task.batches()
        self.times: list[float] = []
        self.curve: list[float] = []
        self.done = 0

    def turn(self, steps: int) -> None:
        self.model.train()
        for i in range(steps):
            x, y = next(self.batches)
            start = time.perf_counter()
            if self.ac is None:
                loss = self.task.loss(self.model, x, y)
            else:
                with self.ac:
                    loss = self.task.loss(self.model, x, y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.sched.step()
            if i:  # each turn's first step pays for the switch
                self.times.append(time.perf_counter() - start)
            self.done += 1

    @property
    def reduction(self) -> float:
        return 1.0 if self.ac is None else self.ac.stats.ratio


def quarter_marks(steps: int) -> list[int]:
    """The steps at which the curve is read: the quarters of the run, at turns' ends."""
    return [min(steps, max(TURN, round(steps * k / 4 / TURN) * TURN)) for k in (1, 2, 3, 4)]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rels", type=float, nargs="+", default=[1e-2, 1e-1])
    p.add_argument("--val-batches", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = lm_task(torch.device("cpu"), val_batches=args.val_batches, batch=args.batch)
    runs = [Run(task, name, s, args) for name, s in variants(args.rels)]
    marks = quarter_marks(args.steps)
    while runs[0].done < args.steps:
        n = min(TURN, args.steps - runs[0].done)
        for r in runs:
            r.turn(n)
            if r.done in marks:
                r.curve.append(task.evaluate(r.model))
    print_table(runs, args)
    return 0


def print_table(runs: list[Run], args) -> None:
    base_time = statistics.median(runs[0].times)
    base_loss = runs[0].curve[-1]
    q = [f"val @{m}" for m in quarter_marks(args.steps)]
    head = ["variant", "reduction", *q, "delta %", "step time"]
    rows = []
    for r in runs:
        delta = 100.0 * (r.curve[-1] - base_loss) / base_loss
        rows.append(
            [
                r.name,
                f"{r.reduction:.1f}x",
                *(f"{v:.4f}" for v in r.curve),
                f"{delta:+.2f}",
                f"{statistics.median(r.times) / base_time:.2f}x",
            ]
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    sep = " | " if args.markdown else "  "
    edge = ("| ", " |") if args.markdown else ("", "")
    print(edge[0] + sep.join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + edge[1])
    if args.markdown:
        print("| " + " | ".join("-" * w for w in widths) + " |")
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        print(edge[0] + sep.join(cells) + edge[1])


if __name__ == "__main__":
    raise SystemExit(main())
