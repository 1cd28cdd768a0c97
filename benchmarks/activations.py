"""Activation-compression benchmark: two real models, plain vs compressed saved activations.

Trains each model from the same initial weights (seed 0) on the same batches for the
same number of steps, once per variant, and reports what autograd keeps for backward.
The variants take turns of 10 steps each, so that the shared machine's load, which
moves by tens of percent from minute to minute, moves all of them alike:

  uncompressed       plain training
  save_on_cpu        ``torch.autograd.graph.save_on_cpu(pin_memory=False)`` around forward:
                     the same bytes, held in host memory (no reduction on a CPU-only machine)
  checkpoint         ``torch.utils.checkpoint.checkpoint(use_reentrant=False)`` per conv
                     stage / transformer block (BatchNorm running stats are not updated again
                     by the recomputation)
  tp block adaptive  ``ActivationCompression(codec="block", rel=2e-2,
                     adaptive=Adaptive(ceiling=--ceiling))``: per-layer bounds between rel
                     2e-2 and the ceiling
  tp block rel=1e-2  ``ActivationCompression(codec="block", rel=1e-2, device_path=False)``
  tp device codes    ``ActivationCompression(codec="block", rel=1e-2, device_path=True)``:
  rel=1e-2           block codes made on the tensor's device, no host waits
  tp device adaptive tp block adaptive's bounds with ``device_path=True``: learned
                     tolerances passed to the device's kernels as device scalars
  tp quant 2-bit     ``ActivationCompression(codec="quant", bits=2)``

Models (``activation_models.py``): a CNN (4 conv3x3+BatchNorm+ReLU layers, 32/32/64/64
channels, two of stride 2, global average pool, linear) on scikit-learn's digits upsampled
to 32x32 (last 360 images held out; SGD, momentum 0.9, lr 0.05, batch 64), scored by test
accuracy in %; a byte-level transformer LM (3 pre-LN blocks, d_model 128, 4 heads,
context 128, causal ``scaled_dot_product_attention``, GELU MLP; AdamW lr 3e-3, batch 32)
on the first 2 MB (2e6 bytes) of the Python standard library's ``*.py`` files (sorted by
name; 90/10 train/val split), scored by the mean cross-entropy (nats/byte) over 20 fixed
val batches; and three ViT-style image transformers on the same digits (pre-LN blocks,
softmax attention written out, GELU MLP, patch embedding flattened and transposed as
timm does; AdamW lr 1e-3, weight decay 0.05), scored by test accuracy: ``vit`` (32x32
images, 4x4 patches: 64 tokens, width 128, 4 blocks, 4 heads, MLP ratio 4, batch 64),
the one the CPU path was profiled and tuned on; ``vit-b`` (24x24 images, 2x2 patches:
144 tokens, width 192, 3 blocks, 6 heads, MLP ratio 4, batch 32), held out at first,
since used to set one threshold; and ``vit-c`` (30x30 images, 3x3 patches: 100 tokens,
width 160, 2 blocks, 10 heads of 16, MLP ratio 2, batch 40), held out from all tuning,
with less compute per saved byte than either. The ViTs run the baselines and the two
``tp block`` rows only. All learning rates decay linearly to 0 over the run, so the
score is that of a finished run rather than of wherever the last noisy steps left it.

Columns, per variant (MiB = 2**20 bytes): activation bytes autograd saves in one step,
bytes held for them, reduction (saved / held), peak held during the step, the final
metric and its change against ``uncompressed`` (accuracy: points; loss: %), the median
step time (after 3 warm-ups, and leaving out the first step of each turn) divided by
the uncompressed one, and on CUDA ``torch.cuda.memory_allocated`` just after the last
step's forward and the most ``torch.cuda.max_memory_allocated`` reached in a turn, each
less what was allocated when the turn began (every variant's model and optimizer state;
``n/a`` on CPU). The tensorpress rows report
``ac.stats`` of the last training step. The baselines are measured by one extra
forward of the first batch under a counting ``saved_tensors_hooks``: floating tensors
that are not parameters or buffers, ``numel * element_size`` per save (a tensor saved by
two ops counts twice; ``ac.stats`` also counts integer tensors, such as the LM's token
indices, kept as they are). checkpoint holds what that hook sees with checkpointing on (the
stage inputs and the head); its peak adds the largest stage's recomputed activations.
Each model ends with a target line for ``tp block adaptive``: reduction >= 10x, accuracy
no more than 0.5 points below / val loss no more than 2% above uncompressed, step time
<= 1.5x uncompressed; and one for ``tp device adaptive``: reduction >= 8x, accuracy no
more than 0.5 points below / val loss no more than 1% above (its step time is the GPU's
to show). Each ViT ends with a line of the baselines' step times and one per tp row,
against its targets: step time <= 1.3x uncompressed and reduction >= 8x. Without
``tensorpress.activation_offload`` the tp rows are skipped.

    python benchmarks/activations.py                  # full run, about 15 min on 2 cores
    python benchmarks/activations.py --quick          # smoke run, under a minute
    python benchmarks/activations.py --only lm --steps-lm 1000 --ceiling 0.03
    python benchmarks/activations.py --only vit vit-b vit-c  # the transformers' CPU targets
    python benchmarks/activations.py --only vit vit-b vit-c --threads 1 --cpu-time  # loaded
    python benchmarks/activations.py --markdown       # tables for RESULTS.md
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn


def _as_siblings(*names: str) -> None:
    """Let the sibling modules ``names`` be imported by their bare names: run as a script,
    this file has benchmarks/ on sys.path; imported as benchmarks.activations it has not,
    and each is then loaded once, as benchmarks.<name>, under both names."""
    if __package__:
        for name in names:
            sys.modules.setdefault(name, importlib.import_module(f"{__package__}.{name}"))


_as_siblings("activation_models", "activation_report")
# ByteLM, lm_task, stdlib_bytes, Task, Result and CHECKPOINT are imported from here by
# other benchmarks (gpt2_memory.py, gradients.py, unbiased.py)
from activation_models import (  # noqa: E402
    LM_BATCH,
    LM_VAL_BATCHES,
    SEED,
    VIT_SHAPES,
    ByteLM,  # noqa: F401 - re-exported
    Task,
    cnn_task,
    lm_task,
    load_digits,
    stdlib_bytes,  # noqa: F401 - re-exported
    vit_task,
)
from activation_report import (  # noqa: E402
    CHECKPOINT,
    SAVE_ON_CPU,
    TP_ADAPTIVE,
    TP_BLOCK,
    TP_DEVICE_ADAPTIVE,
    TRANSFORMER_ROWS,
    UNCOMPRESSED,
    Result,
    print_table,
    print_targets,
)

DEFAULT_STEPS_CNN = 300
DEFAULT_STEPS_LM = 150
ADAPTIVE_REL = 2e-2  # the bound of tp block adaptive: per-layer bounds start here
DEFAULT_CEILING = 0.05
WARMUP = 3  # steps left out of the step-time median
TURN = 10  # variants train in turns of this many steps (the first of each left out)
QUICK_STEPS, QUICK_WARMUP, QUICK_VAL_BATCHES = 6, 2, 4
DEFAULT_STEPS_VIT = 100


# --------------------------------------------------------------------------- measuring


def count_saved(task: Task, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[int]:
    """Bytes autograd saves in one forward: ``[outside stages, stage 0, stage 1, ...]``.

    Floating tensors that share no storage with a parameter or buffer, ``numel *
    element_size`` per save; the model's state (BN running stats) is restored after.
    """
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    counts, where = [0] * (len(model.stages) + 1), [0]

    def pack(t):
        if t.is_floating_point() and t.untyped_storage().data_ptr() not in own:
            counts[where[0]] += t.numel() * t.element_size()
        return t

    handles = []
    for i, stage in enumerate(model.stages, start=1):
        handles.append(stage.register_forward_pre_hook(lambda *_, i=i: where.__setitem__(0, i)))
        handles.append(stage.register_forward_hook(lambda *_: where.__setitem__(0, 0)))
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        task.loss(model, x, y)
    for h in handles:
        h.remove()
    model.load_state_dict(state)
    return counts


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_context(variant: str, make_ac: Callable[[], object] | None):
    """(per-step context factory, ActivationCompression or None) for a variant."""
    if make_ac is not None:
        ac = make_ac()
        return (lambda: ac), ac
    if variant == SAVE_ON_CPU:
        return (lambda: torch.autograd.graph.save_on_cpu(pin_memory=False)), None
    return contextlib.nullcontext, None


class Training:
    """One variant's training run, advanced a turn at a time (variants take turns, so
    that the machine's load moves all of them alike)."""

    #: what a step's time is read from: wall time, or with --cpu-time the process's CPU
    #: time (at --threads 1 what the step computes, whatever else the machine runs)
    clock = staticmethod(time.perf_counter)

    def __init__(self, task, variant, make_ac, steps: int, device: torch.device):
        self.task, self.variant, self.steps, self.device = task, variant, steps, device
        torch.manual_seed(SEED)
        self.model = task.make_model().to(device)
        self.model.checkpointed = variant == CHECKPOINT
        self.opt = task.make_optimizer(self.model)
        # linear decay to 0: the final metric is then that of a converged run, not of
        # wherever the last noisy steps left it
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda i: 1.0 - i / steps)
        self.context, self.ac = _step_context(variant, make_ac)
        self.batches = task.batches()
        self.done, self.times, self.first = 0, [], None
        self.cuda_held = self.cuda_peak = None

    def turn(self, n: int, warmup: int) -> None:
        """Train ``n`` more steps; their times count after the run's first ``warmup``
        steps, except a turn's first (its caches hold another variant's model)."""
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        self.model.train()
        for i in range(min(n, self.steps - self.done)):
            x, y = next(self.batches)
            self.first = self.first or (x, y)
            _sync(self.device)
            t0 = self.clock()
            self.opt.zero_grad(set_to_none=True)
            with self.context():
                loss = self.task.loss(self.model, x, y)
            if cuda:
                held = torch.cuda.memory_allocated(self.device) - before
            loss.backward()
            self.opt.step()
            self.sched.step()
            _sync(self.device)
            if i > 0 and self.done >= warmup:
                self.times.append(self.clock() - t0)
            self.done += 1
        if cuda:
            peak = torch.cuda.max_memory_allocated(self.device) - before
            self.cuda_held = held
            self.cuda_peak = max(self.cuda_peak or 0, peak)

    def result(self) -> Result:
        res = Result(self.variant, step_s=statistics.median(self.times))
        res.cuda_held, res.cuda_peak = self.cuda_held, self.cuda_peak
        if self.ac is not None:
            s = self.ac.stats
            res.saved, res.held, res.peak = s.saved_bytes, s.stored_bytes, s.peak_stored_bytes
        else:
            _measure_baseline(res, self.task, self.model, self.first, self.device)
        res.metric = self.task.evaluate(self.model)
        return res


def _measure_baseline(
    res: Result,
    task: Task,
    model: nn.Module,
    batch: tuple[torch.Tensor, torch.Tensor],
    device: torch.device,
) -> None:
    """Fill in saved/held/peak bytes of a baseline variant with counting passes."""
    model.checkpointed = False
    plain = count_saved(task, model, *batch)
    res.saved = sum(plain)
    if res.variant == CHECKPOINT:
        model.checkpointed = True
        res.held = sum(count_saved(task, model, *batch))
        res.peak = res.held + max(plain[1:])
        res.note = "recomputes each stage in backward; peak = held + largest stage"
        return
    res.held = res.peak = res.saved
    if res.variant == SAVE_ON_CPU:
        res.note = "held in host memory" + (" (= device here)" if device.type == "cpu" else "")


def tp_variants(ceiling: float, notes: list[str]) -> list[tuple[str, Callable[[], object] | None]]:
    """The tensorpress rows as (name, ActivationCompression factory or None if skipped)."""
    names = (TP_ADAPTIVE, TP_BLOCK, "tp device codes rel=1e-2", TP_DEVICE_ADAPTIVE)
    names += ("tp quant 2-bit",)
    try:
        from tensorpress.activation_offload import ActivationCompression, Adaptive
    except ImportError as exc:
        notes.append(f"tensorpress.activation_offload not importable ({exc}): tp rows skipped")
        return [(name, None) for name in names]
    kwargs = (
        {"codec": "block", "rel": ADAPTIVE_REL, "adaptive": Adaptive(ceiling=ceiling)},
        {"codec": "block", "rel": 1e-2, "adaptive": False, "device_path": False},
        {"codec": "block", "rel": 1e-2, "device_path": True},  # no host waits
        {  # the adaptive row's bounds, on the device path
            "codec": "block",
            "rel": ADAPTIVE_REL,
            "adaptive": Adaptive(ceiling=ceiling),
            "device_path": True,
        },
        {"codec": "quant", "bits": 2},
    )
    return [
        (name, lambda kw=kw: ActivationCompression(**kw))
        for name, kw in zip(names, kwargs, strict=True)
    ]


def run_task(
    task: Task,
    tp_rows: list[tuple[str, Callable[[], object] | None]],
    steps: int,
    warmup: int,
    device: torch.device,
) -> list[Result]:
    """Train every variant, in turns of ``TURN`` steps each, and score them."""
    variants = [(v, None) for v in (UNCOMPRESSED, SAVE_ON_CPU, CHECKPOINT)] + list(tp_rows)
    runs: dict = {}
    for variant, make_ac in variants:
        if variant not in (UNCOMPRESSED, SAVE_ON_CPU, CHECKPOINT) and make_ac is None:
            runs[variant] = Result(variant, note="skipped (no tensorpress.activation_offload)")
            continue
        try:
            runs[variant] = Training(task, variant, make_ac, steps, device)
        except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the run
            runs[variant] = Result(variant, note=f"!! {type(exc).__name__}: {exc}")
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
    for _ in range(0, steps, TURN):
        for variant, run in runs.items():
            if not isinstance(run, Training):
                continue
            try:
                run.turn(TURN, warmup)
            except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the run
                runs[variant] = Result(variant, note=f"!! {type(exc).__name__}: {exc}")
    return [run.result() if isinstance(run, Training) else run for run in runs.values()]


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train a CNN and a byte-level LM with plain, offloaded, checkpointed "
        "and tensorpress-compressed activations."
    )
    p.add_argument(
        "--steps-cnn", type=int, default=None, help=f"CNN steps (default {DEFAULT_STEPS_CNN})"
    )
    p.add_argument(
        "--steps-lm", type=int, default=None, help=f"LM steps (default {DEFAULT_STEPS_LM})"
    )
    p.add_argument(
        "--quick", action="store_true", help=f"smoke run: {QUICK_STEPS} steps per variant"
    )
    p.add_argument(
        "--ceiling",
        type=float,
        default=DEFAULT_CEILING,
        help=f"rel ceiling of tp block adaptive (bound rel={ADAPTIVE_REL:g}; "
        f"default {DEFAULT_CEILING})",
    )
    p.add_argument("--digits", default=None, help="digits .npz from --export-digits")
    p.add_argument("--export-digits", default=None, help="write scikit-learn's digits here, exit")
    p.add_argument(
        "--only",
        choices=("cnn", "lm", *VIT_SHAPES),
        nargs="+",
        default=None,
        help="run these models only",
    )
    p.add_argument(
        "--steps-vit",
        type=int,
        default=None,
        help=f"steps of each ViT (default {DEFAULT_STEPS_VIT})",
    )
    p.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    p.add_argument("--device", default=None, help="torch device (default cuda if available)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="step times in process CPU seconds, not wall time (with --threads 1: the "
        "work a step does, steady on a machine others load)",
    )
    p.add_argument(
        "--lm-batch", type=int, default=LM_BATCH, help=f"LM batch size (default {LM_BATCH})"
    )
    args = p.parse_args(argv)
    default_cnn, default_lm = (
        (QUICK_STEPS, QUICK_STEPS) if args.quick else (DEFAULT_STEPS_CNN, DEFAULT_STEPS_LM)
    )
    args.steps_cnn = args.steps_cnn or default_cnn
    args.steps_lm = args.steps_lm or default_lm
    args.steps_vit = args.steps_vit or (QUICK_STEPS if args.quick else DEFAULT_STEPS_VIT)
    args.warmup = QUICK_WARMUP if args.quick else WARMUP
    if min(args.steps_cnn, args.steps_lm, args.steps_vit) <= args.warmup:
        p.error(f"--steps-cnn, --steps-lm and --steps-vit must exceed {args.warmup} warm-ups")
    if not ADAPTIVE_REL <= args.ceiling < 1:
        p.error(f"--ceiling must lie in [{ADAPTIVE_REL:g}, 1)")
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.export_digits:
        images, target = load_digits(None)
        np.savez_compressed(args.export_digits, images=images, target=target)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_time:
        Training.clock = staticmethod(time.process_time)
    device = args.device
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print("Activation-compression benchmark (MiB = 2**20 bytes; seed 0 for every variant)")
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, device {device}{gpu}, step time in "
        + ("process CPU seconds" if args.cpu_time else "wall seconds")
    )
    notes: list[str] = []
    tp_rows = tp_variants(args.ceiling, notes)
    for note in notes:
        print(f"note: {note}")
    sys.stdout.flush()

    val_batches = QUICK_VAL_BATCHES if args.quick else LM_VAL_BATCHES
    tasks = {
        "cnn": (lambda: cnn_task(device, args.digits), args.steps_cnn),
        "lm": (lambda: lm_task(device, val_batches, args.lm_batch), args.steps_lm),
    }
    for name in VIT_SHAPES:
        tasks[name] = (lambda name=name: vit_task(name, device, args.digits), args.steps_vit)
    for name, (make_task, steps) in tasks.items():
        if args.only is not None and name not in args.only:
            continue
        started = time.perf_counter()
        task = make_task()
        rows = tp_rows
        if name in VIT_SHAPES:  # the CPU path's rows: block codes, fixed and adaptive bounds
            rows = [(v, make) for v, make in tp_rows if v in TRANSFORMER_ROWS]
        results = run_task(task, rows, steps, args.warmup, device)
        title = (
            f"{name}: {steps} steps in turns of {TURN}, step time = median after "
            f"{args.warmup} warm-ups and each turn's first / uncompressed, "
            f"tp block adaptive rel {ADAPTIVE_REL:g} .. {args.ceiling:g}"
        )
        print_table(task, results, title, args.markdown)
        print()
        print_targets(task, results)
        print(f"({name}: {time.perf_counter() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
