"""The tables and target lines of benchmarks/activations.py, and the names of its rows."""

from __future__ import annotations

from dataclasses import dataclass

try:
    from activation_models import VIT_SHAPES, Task
    from compressors import Table
    from compressors import fmt_cell as _fmt
    from compressors import ratio_or_none as _ratio
except ImportError:  # imported as benchmarks.activation_report
    from benchmarks.activation_models import VIT_SHAPES, Task
    from benchmarks.compressors import Table
    from benchmarks.compressors import fmt_cell as _fmt
    from benchmarks.compressors import ratio_or_none as _ratio

MIB = 2**20
UNCOMPRESSED, SAVE_ON_CPU, CHECKPOINT = "uncompressed", "save_on_cpu", "checkpoint"
TP_ADAPTIVE = "tp block adaptive"
TP_DEVICE_ADAPTIVE = "tp device adaptive"
TP_BLOCK = "tp block rel=1e-2"
TRANSFORMER_ROWS = (TP_ADAPTIVE, TP_BLOCK)  # the tp rows the ViTs run
TARGET_VIT_TIME_X = 1.3  # their step time over uncompressed
TARGET_VIT_REDUCTION = 8.0  # and their saved / held
TARGET_REDUCTION = 10.0  # tp block adaptive saved / held
TARGET_ACC_POINTS = 0.5  # at most this many accuracy points below uncompressed
TARGET_LOSS_PCT = 2.0  # val loss at most this many % above uncompressed
TARGET_TIME_X = 1.5  # step time over uncompressed
TARGET_DEVICE_REDUCTION = 8.0  # tp device adaptive saved / held
TARGET_DEVICE_LOSS_PCT = 1.0  # its val loss at most this many % above uncompressed


@dataclass
class Result:
    variant: str
    saved: int | None = None  # bytes
    held: int | None = None
    peak: int | None = None
    metric: float | None = None
    step_s: float | None = None  # median step time
    cuda_peak: int | None = None  # bytes
    cuda_held: int | None = None  # bytes allocated after the last forward
    note: str = ""


# --------------------------------------------------------------------------- printing


def _cuda_cell(r: Result, nbytes: int | None) -> str:
    if r.metric is None:  # not run
        return "-"
    return "n/a" if nbytes is None else f"{nbytes / MIB:.1f}"


def print_table(task: Task, results: list[Result], title: str, markdown: bool) -> None:
    base = results[0]
    metric_spec = ".2f" if task.name == "cnn" else ".4f"
    table = Table(
        title,
        [
            ("variant", 17, "<"),
            ("saved MiB", 9, ">"),
            ("held MiB", 8, ">"),
            ("reduction", 9, ">"),
            ("peak held MiB", 13, ">"),
            (task.metric, 10, ">"),
            (task.delta, 9, ">"),
            ("step time", 9, ">"),
            ("cuda after fwd MiB", 18, ">"),
            ("cuda max MiB", 12, ">"),
            ("note", 4, "<"),
        ],
        markdown,
    )
    table.header()
    for r in results:
        change = None if r.metric is None else task.change(r.metric, base.metric)
        table.row(
            r.variant,
            _fmt(_ratio(r.saved, MIB), ".2f"),
            _fmt(_ratio(r.held, MIB), ".2f"),
            _fmt(_ratio(r.saved, r.held), ".1f", "x"),
            _fmt(_ratio(r.peak, MIB), ".2f"),
            _fmt(r.metric, metric_spec),
            _fmt(change, "+.2f"),
            _fmt(_ratio(r.step_s, base.step_s), ".2f", "x"),
            _cuda_cell(r, r.cuda_held),
            _cuda_cell(r, r.cuda_peak),
            r.note,
        )


def print_targets(task: Task, results: list[Result]) -> None:
    if task.name in VIT_SHAPES:
        print_transformer_targets(task, results)
        return
    base = results[0]
    r = next(r for r in results if r.variant == TP_ADAPTIVE)
    if r.metric is None:
        print(f"{task.name} targets ({TP_ADAPTIVE}): NOT MET (no result: {r.note})")
        return
    reduction = r.saved / r.held
    change = task.change(r.metric, base.metric)
    time_x = r.step_s / base.step_s
    if task.name == "cnn":
        quality = (change >= -TARGET_ACC_POINTS, f"accuracy {change:+.2f} pts (>= -0.5)")
    else:
        quality = (change <= TARGET_LOSS_PCT, f"val loss {change:+.2f}% (<= +2%)")
    checks = [
        (reduction >= TARGET_REDUCTION, f"reduction {reduction:.1f}x (>= 10x)"),
        quality,
        (time_x <= TARGET_TIME_X, f"step time {time_x:.2f}x (<= 1.5x)"),
    ]
    text = "; ".join(f"{what} {'MET' if ok else 'NOT MET'}" for ok, what in checks)
    print(f"{task.name} targets ({TP_ADAPTIVE}): {text}")
    print_device_target(task, results)


def print_transformer_targets(task: Task, results: list[Result]) -> None:
    """The CPU targets for a ViT: each tp row at most 1.3x the uncompressed step
    time with at least 8x fewer bytes held; beside them the baselines' step times."""
    base = results[0]
    times = {r.variant: _ratio(r.step_s, base.step_s) for r in results}
    print(
        f"{task.name}: uncompressed step {base.step_s * 1e3:.0f} ms; step time over it: "
        + ", ".join(f"{v} {_fmt(x, '.2f', 'x')}" for v, x in times.items() if v != UNCOMPRESSED)
    )
    for r in results:
        if r.variant not in TRANSFORMER_ROWS:
            continue
        if r.metric is None:
            print(f"{task.name} targets ({r.variant}): NOT MET (no result: {r.note})")
            continue
        reduction, time_x = r.saved / r.held, r.step_s / base.step_s
        checks = [
            (time_x <= TARGET_VIT_TIME_X, f"step time {time_x:.2f}x (<= 1.3x)"),
            (reduction >= TARGET_VIT_REDUCTION, f"reduction {reduction:.1f}x (>= 8x)"),
        ]
        text = "; ".join(f"{what} {'MET' if ok else 'NOT MET'}" for ok, what in checks)
        change = task.change(r.metric, base.metric)
        print(f"{task.name} targets ({r.variant}): {text} (accuracy {change:+.2f} pts)")


def print_device_target(task: Task, results: list[Result]) -> None:
    """The device path's target: 8x at no more than 1% more val loss (LM) or
    0.5 accuracy points less (CNN); its step time is measured on a GPU."""
    base = results[0]
    r = next((r for r in results if r.variant == TP_DEVICE_ADAPTIVE), None)
    if r is None or r.metric is None:
        return
    change = task.change(r.metric, base.metric)
    ok = change >= -TARGET_ACC_POINTS if task.name == "cnn" else change <= TARGET_DEVICE_LOSS_PCT
    unit = "pts (>= -0.5)" if task.name == "cnn" else "% (<= +1%)"
    reduction = r.saved / r.held
    checks = [
        (reduction >= TARGET_DEVICE_REDUCTION, f"reduction {reduction:.1f}x (>= 8x)"),
        (ok, f"{task.metric} {change:+.2f} {unit}"),
    ]
    text = "; ".join(f"{what} {'MET' if ok else 'NOT MET'}" for ok, what in checks)
    print(f"{task.name} targets ({TP_DEVICE_ADAPTIVE}): {text}")
