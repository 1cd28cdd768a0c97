"""GPT-2-small-shaped decoder: what compressed activations buy in memory, time and batch.

A decoder of GPT-2 small's shape (12 pre-LN blocks, width 768, 12 heads, context
1024, GELU MLP; ``activations.ByteLM``, a 256-byte vocabulary) trained under bf16
autocast on byte-level text of the Python standard library's top-level ``*.py``
files (``activations.stdlib_bytes``, 90/10 train/val split; AdamW lr 1e-3, linear
decay to 0 over ``--steps``). Variants, from the same initial weights (seed 0) on the
same batches, taking turns of ``--turn`` steps so the machine's load moves all alike:

  plain              plain training
  checkpoint         ``torch.utils.checkpoint`` per block (recomputed in backward)
  tp quant 2-bit     ``ActivationCompression(codec="quant", bits=2)`` (ActNN-like)
  tp block adaptive  ``ActivationCompression(codec="block", rel=1e-2, adaptive=Adaptive(...))``
  tp device codes    ``ActivationCompression(codec="block", rel=1e-2, device_path=True)``
  tp offload         the device codes' settings plus ``offload=Offload(TieredStore(...))``:
                     payloads in pinned host memory until backward (the ``records`` note
                     says which records the library made)

A variant whose settings this build refuses, or that fails, is listed with the error
(``skipped: ...`` or ``!! ...``) and the others go on.

Training table, per variant: median step time (after ``--warmup`` steps and each
turn's first) over plain's; the most ``torch.cuda.max_memory_allocated`` reached in a
turn less what was allocated when the turn began (every variant's weights and
optimizer state: what the step itself needs, activations first); activation bytes
saved and held in one step and their ratio (``ac.stats``; the baselines by a counting
pass, as in ``activations.py``); validation loss (mean cross-entropy, nats/byte, over
``--val-batches`` fixed batches) and its change against plain, in %.

Batch table: the largest batch whose training step (forward, backward, AdamW step)
fits under a memory cap (``torch.cuda.set_per_process_memory_fraction`` of
``--cap-gib`` GiB, a fresh model and optimizer per variant): double the batch until
``torch.OutOfMemoryError``, then bisect. That batch over plain's is what a user gains.
On the CPU there is no cap: the search stops at ``--max-batch`` (it only proves the
code runs).

Targets, printed beside the results for each tensorpress row: activation reduction
>= 8x, step time <= 1.2x plain, validation loss within 1% of plain, largest batch
>= 4x plain's. ``--budget-s`` bounds the whole run: training stops after the last
round of turns that fits (the table says how many steps ran), the batch search keeps
``--search-s`` of it and leaves out what does not fit, with a note.

    python benchmarks/gpt2_memory.py                       # on a GPU (gpu_all.py runs it)
    python benchmarks/gpt2_memory.py --variants checkpoint "tp device codes"  # and plain
    python benchmarks/gpt2_memory.py --device cpu --layers 2 --width 64 --heads 4 \\
        --seq 64 --batch 4 --steps 6 --max-batch 8          # tiny, on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

try:
    from activations import CHECKPOINT, ByteLM, Result, Task, Training, stdlib_bytes
    from compressors import Table
    from compressors import fmt_cell as _fmt
    from compressors import ratio_or_none as _ratio
except ImportError:  # imported as benchmarks.gpt2_memory
    from benchmarks.activations import CHECKPOINT, ByteLM, Result, Task, Training, stdlib_bytes
    from benchmarks.compressors import Table
    from benchmarks.compressors import fmt_cell as _fmt
    from benchmarks.compressors import ratio_or_none as _ratio

SEED = 0
MIB, GIB = 2**20, 2**30
PLAIN = "plain"
DEVICE_CODES = "tp device codes"
OFFLOAD = "tp offload"
TEXT_BYTES = 8_000_000  # stdlib text read (all of the top-level files, if fewer)
TARGET_REDUCTION = 8.0
TARGET_TIME_X = 1.2
TARGET_LOSS_PCT = 1.0
TARGET_BATCH_X = 4.0
# searched in this order, as long as the time budget lasts
SEARCHED = (PLAIN, CHECKPOINT, DEVICE_CODES, OFFLOAD, "tp quant 2-bit", "tp block adaptive")


class OutOfTime(Exception):
    """The run's time budget is spent."""


# --------------------------------------------------------------------------- task


def gpt2_task(args: argparse.Namespace, device: torch.device) -> Task:
    """The decoder, its optimizer, byte windows of ``args.seq`` + 1 and the val loss."""
    data = stdlib_bytes(TEXT_BYTES).to(device)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    span = torch.arange(args.seq + 1, device=device)
    if len(val) <= args.seq + 1:
        raise SystemExit(f"--seq {args.seq} is longer than the validation text")

    def windows(source, g, batch=args.batch):
        starts = torch.randint(len(source) - args.seq - 1, (batch, 1), generator=g)
        chunk = source[starts.to(device) + span].long()
        return chunk[:, :-1], chunk[:, 1:]

    def batches():
        g = torch.Generator().manual_seed(SEED)
        while True:
            yield windows(train, g)

    def loss(model, x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    @torch.no_grad()
    def evaluate(model):
        model.eval()
        g = torch.Generator().manual_seed(SEED + 1)
        return statistics.fmean(
            loss(model, *windows(val, g)).item() for _ in range(args.val_batches)
        )

    task = Task(
        "gpt2",
        "val loss",
        "delta %",
        lambda: ByteLM(args.layers, args.width, args.heads, args.seq),
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01),
        batches,
        loss,
        evaluate,
        lambda v, base: 100.0 * (v - base) / base,
    )
    task.windows = lambda batch: windows(train, torch.Generator().manual_seed(SEED), batch)
    return task


def variants(args, notes: list[str]) -> list[tuple[str, Callable[[], object] | None]]:
    """(name, ActivationCompression factory; None for the baselines)."""
    rows: list[tuple[str, Callable[[], object] | None]] = [(PLAIN, None), (CHECKPOINT, None)]
    try:
        from tensorpress.activation_offload import (
            ActivationCompression,
            Adaptive,
            Offload,
            TieredStore,
        )
    except ImportError as exc:
        notes.append(f"tensorpress.activation_offload not importable ({exc}): tp rows skipped")
        return rows
    adaptive = Adaptive(update_every=max(1, min(10, args.steps // 3)))
    store: list = []  # one store for the run, made when the variant is

    def offload():
        if not store:
            store.append(TieredStore(int(args.store_gib * GIB)))
        return Offload(store[0], prefetch=2)

    kwargs = {
        "tp quant 2-bit": lambda: {"codec": "quant", "bits": 2},
        "tp block adaptive": lambda: {"codec": "block", "rel": 1e-2, "adaptive": adaptive},
        DEVICE_CODES: lambda: {"codec": "block", "rel": 1e-2, "device_path": True},
        OFFLOAD: lambda: {
            "codec": "block",
            "rel": 1e-2,
            "device_path": True,
            "offload": offload(),
        },
    }
    return rows + [
        (name, lambda kw=kw: ActivationCompression(**kw())) for name, kw in kwargs.items()
    ]


# --------------------------------------------------------------------------- training


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def train_all(task, rows, args, device, deadline: float) -> tuple[list[Result], int]:
    """Train every variant in turns until ``args.steps`` or the round that would pass
    ``deadline``; (results, steps each variant ran)."""
    runs: dict = {}
    for variant, make_ac in rows:
        try:
            runs[variant] = Training(task, variant, make_ac, args.steps, device)
        except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the run
            runs[variant] = Result(variant, note=f"skipped: {type(exc).__name__}: {exc}")
    _free(device)
    done, round_s = 0, 0.0
    while done < args.steps and time.perf_counter() + round_s < deadline:
        for variant, run in runs.items():
            # a round far slower than its estimate still ends near the deadline
            if not isinstance(run, Training) or time.perf_counter() > deadline + round_s:
                continue
            try:
                run.turn(args.turn, args.warmup)
            except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the run
                runs[variant] = Result(variant, note=f"!! {type(exc).__name__}: {exc}")
                _free(device)
        done = min(args.steps, done + args.turn)
        round_s = _next_round_s(runs.values(), args.turn)
    results = [_result(run, done) if isinstance(run, Training) else run for run in runs.values()]
    return results, done


def _next_round_s(runs, turn: int) -> float:
    """Seconds the next round of turns should take: each variant's median step so far
    (the first round's time would count numba's and Triton's compiling again), plus a
    tenth for the steps the median leaves out."""
    steps = [statistics.median(r.times) for r in runs if isinstance(r, Training) and r.times]
    return 1.1 * turn * sum(steps)


def _result(run: Training, steps: int) -> Result:
    """The run's result; its note names the records it made, and the steps it ran when
    the time budget cut its last turn (fewer than ``steps``)."""
    if not run.times:  # stopped before a timed step
        run.times.append(float("nan"))
    res = run.result()
    if run.ac is not None:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(run.ac.stats.records.items()))
        res.note = f"records: {kinds}"
    if run.done < steps:
        res.note = f"{run.done} steps (time budget); {res.note}".rstrip("; ")
    return res


# --------------------------------------------------------------------------- batch search


def largest_batch(fits: Callable[[int], bool], limit: int) -> tuple[int, str]:
    """Largest batch in [1, ``limit``] for which ``fits`` holds (``fits`` monotone:
    true up to some batch, false above), doubling from 1 until it fails, then
    bisecting; (batch or 0 if none fits, how the search ended: ``"exact"``, ``"limit"``
    (every doubling up to ``limit`` fit) or ``"time"`` (``fits`` raised
    :class:`OutOfTime`): in the last two the batch is a lower bound)."""
    lo, hi = 0, None
    try:
        b = 1
        while b <= limit:
            if not fits(b):
                hi = b
                break
            lo, b = b, 2 * b
        if hi is None:
            return lo, "limit"
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    except OutOfTime:
        return lo, "time"
    return lo, "exact"


def search_variant(task, variant, make_ac, args, device, deadline) -> tuple[int, str, int]:
    """(largest batch, how the search ended, peak bytes of the step at that batch) for
    one variant (see :func:`largest_batch`)."""
    torch.manual_seed(SEED)
    model = task.make_model().to(device)
    model.checkpointed = variant == CHECKPOINT
    opt = task.make_optimizer(model)
    context = (lambda ac: lambda: ac)(make_ac()) if make_ac else contextlib.nullcontext
    peaks: dict[int, int] = {}

    def fits(batch: int) -> bool:
        if time.perf_counter() > deadline:
            raise OutOfTime
        x, y = task.windows(batch)
        ok, loss = True, None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            opt.zero_grad(set_to_none=True)
            with context():
                loss = task.loss(model, x, y)
            loss.backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                peaks[batch] = torch.cuda.max_memory_allocated(device)
        except torch.OutOfMemoryError:
            ok = False
        # the graph of a step that ran out of memory goes before the next try
        loss = x = y = None
        opt.zero_grad(set_to_none=True)
        _free(device)
        return ok

    batch, ended = largest_batch(fits, args.max_batch)
    return batch, ended, peaks.get(batch, 0)


def search_all(task, rows, args, device, deadline) -> dict[str, tuple[int | None, str]]:
    """{variant: (largest batch or None, note)} under the memory cap."""
    found: dict[str, tuple[int | None, str]] = {}
    factories = dict(rows)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * GIB / total), device)
    try:
        for variant in SEARCHED:
            if variant not in factories:
                continue
            if time.perf_counter() > deadline:
                found[variant] = (None, "not searched (time budget)")
                continue
            try:
                batch, ended, peak = search_variant(
                    task, variant, factories[variant], args, device, deadline
                )
            except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the run
                found[variant] = (None, f"!! {type(exc).__name__}: {exc}")
                continue
            finally:
                _free(device)  # the variant's model and optimizer are gone now
            note = f"peak {peak / MIB:.0f} MiB" if peak else ""
            if ended != "exact":
                stop = "--max-batch" if ended == "limit" else "the time budget"
                note = f"at least (stopped at {stop}) {note}"
            found[variant] = (batch, note.strip())
    finally:
        if device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0, device)
    return found


# --------------------------------------------------------------------------- printing


def print_training(task, results: list[Result], title: str, markdown: bool) -> None:
    base = results[0]
    table = Table(
        title,
        [
            ("variant", 17, "<"),
            ("step time", 9, ">"),
            ("cuda peak MiB", 13, ">"),
            ("saved MiB", 9, ">"),
            ("held MiB", 8, ">"),
            ("reduction", 9, ">"),
            ("val loss", 8, ">"),
            ("delta %", 7, ">"),
            ("note", 4, "<"),
        ],
        markdown,
    )
    table.header()
    for r in results:
        change = None if r.metric is None else task.change(r.metric, base.metric)
        table.row(
            r.variant,
            _fmt(_ratio(r.step_s, base.step_s), ".2f", "x"),
            "-" if r.metric is None else _fmt(_ratio(r.cuda_peak, MIB), ".0f", na="n/a"),
            _fmt(_ratio(r.saved, MIB), ".1f"),
            _fmt(_ratio(r.held, MIB), ".1f"),
            _fmt(_ratio(r.saved, r.held), ".1f", "x"),
            _fmt(r.metric, ".4f"),
            _fmt(change, "+.2f"),
            r.note,
        )


def print_batches(found: dict, cap: str, markdown: bool) -> None:
    plain = found.get(PLAIN, (None, ""))[0]
    table = Table(
        f"largest batch under {cap}",
        [("variant", 17, "<"), ("batch", 5, ">"), ("x plain", 7, ">"), ("note", 4, "<")],
        markdown,
    )
    table.header()
    for variant, (batch, note) in found.items():
        table.row(variant, _fmt(batch, "d"), _fmt(_ratio(batch, plain), ".1f", "x"), note)


def print_targets(task, results: list[Result], found: dict) -> None:
    base = results[0]
    plain_batch = found.get(PLAIN, (None, ""))[0]
    for r in results:
        if not r.variant.startswith("tp "):
            continue
        if r.metric is None:
            print(f"targets {r.variant}: no result ({r.note})")
            continue
        batch = found.get(r.variant, (None, ""))[0]
        checks = [
            (_ratio(r.saved, r.held), TARGET_REDUCTION, "reduction {:.1f}x (>= 8x)", True),
            (_ratio(r.step_s, base.step_s), TARGET_TIME_X, "step time {:.2f}x (<= 1.2x)", False),
            (
                abs(task.change(r.metric, base.metric)),
                TARGET_LOSS_PCT,
                "|val loss change| {:.2f}% (<= 1%)",
                False,
            ),
            (_ratio(batch, plain_batch), TARGET_BATCH_X, "largest batch {:.1f}x (>= 4x)", True),
        ]
        parts = []
        for value, target, what, at_least in checks:
            if value is None or value != value:  # not measured, or NaN
                parts.append(what.split(" {")[0] + " not measured")
                continue
            ok = value >= target if at_least else value <= target
            parts.append(f"{what.format(value)} {'MET' if ok else 'NOT MET'}")
        print(f"targets {r.variant}: " + "; ".join(parts))


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="torch device (default cuda if available)")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024, help="context, bytes")
    p.add_argument("--batch", type=int, default=8, help="training batch, sequences")
    p.add_argument("--steps", type=int, default=30, help="training steps per variant")
    p.add_argument("--turn", type=int, default=10, help="steps per turn")
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    p.add_argument("--val-batches", type=int, default=4)
    p.add_argument("--cap-gib", type=float, default=4.0, help="memory cap of the batch search")
    p.add_argument("--max-batch", type=int, default=256, help="largest batch tried")
    p.add_argument("--store-gib", type=float, default=8.0, help="pinned pool of tp offload")
    p.add_argument("--budget-s", type=float, default=180.0, help="seconds for the whole run")
    p.add_argument("--search-s", type=float, default=50.0, help="seconds kept for the search")
    p.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    p.add_argument(
        "--variants",
        nargs="+",
        choices=SEARCHED,
        default=None,
        help="run these variants only (plain always runs: the others are measured against it)",
    )
    args = p.parse_args(argv)
    if args.width % args.heads:
        p.error("--width must be a multiple of --heads")
    if args.steps <= args.warmup or args.turn < 2:
        p.error("--steps must exceed --warmup, and --turn be at least 2")
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    device = args.device
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(
        f"GPT-2-shaped decoder: {args.layers} layers, width {args.width}, {args.heads} heads, "
        f"sequence {args.seq}, batch {args.batch}, bf16 autocast; torch {torch.__version__}, "
        f"device {device}{gpu}; MiB = 2**20 bytes",
        flush=True,
    )
    notes: list[str] = []
    rows = [
        r for r in variants(args, notes) if r[0] == PLAIN or r[0] in (args.variants or SEARCHED)
    ]
    for note in notes:
        print(f"note: {note}")
    task = gpt2_task(args, device)
    end = started + args.budget_s
    results, steps = train_all(task, rows, args, device, end - args.search_s)
    title = (
        f"gpt2 training: {steps} of {args.steps} steps in turns of {args.turn}; step time = "
        f"median after {args.warmup} warm-ups and each turn's first / plain's "
        f"({results[0].step_s * 1e3:.0f} ms); cuda peak = max allocated in a turn less the "
        "turn's start"
    )
    print_training(task, results, title, args.markdown)
    print(f"({time.perf_counter() - started:.0f} s)", flush=True)
    _free(device)
    found = search_all(task, rows, args, device, end)
    cap = f"a cap of {args.cap_gib:g} GiB" if device.type == "cuda" else "no cap (CPU)"
    print()
    print_batches(found, cap, args.markdown)
    print()
    print_targets(task, results, found)
    print(f"({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
