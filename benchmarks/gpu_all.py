"""Everything a GPU must show, in one command that ends within 9 minutes.

GPU time is scarce, so this runs, most important first, each stage with its own time
limit (a stage that runs over is stopped and reported, the next one still runs; the
limits add up to at most ``TOTAL_S``, 9 minutes). Each stage runs in a process group
of its own, which is killed when it ends or runs over, so that no worker of one stage
holds the GPU into the next; one that fails, runs over or does not start is reported
and the others run all the same:

1. ``tests``: the CUDA tests of the device path (``TESTS``, ``-k cuda``): the Triton
   kernels against the torch reference; compress/restore, a training step, offloaded
   codes and a compiled step under ``torch.cuda.set_sync_debug_mode("error")`` (any host
   synchronisation raises);
2. ``gpt2_memory``: ``benchmarks/gpt2_memory.py``, a GPT-2-small-shaped decoder (12
   layers, width 768, sequence 1024, bf16 autocast) with plain, checkpoint, 2-bit quant,
   adaptive block, device codes and compressed offload: step time over plain, peak CUDA
   memory, activation reduction, validation loss change, and the largest batch under a
   4 GiB cap; it keeps to its own time budget (``--budget-s``), under the stage's limit;
3. ``compiled``: ``benchmarks/compiled.py --device cuda``, the compiled-training path:
   eager, ``torch.compile`` and ``compile_with_compression`` (saved activations as codes
   inside inductor's graphs) on the GPT-2-shaped byte LM of the CPU table (6 layers,
   width 384, sequence 256), batch 8, 30 steps: saved activation bytes, peak memory,
   step time and validation loss, and the compiled path's targets (``tp compiled`` against
   ``compile``: saved bytes, step time ratio, val loss); the summary repeats those lines;
4. ``tensor_latency``: ``benchmarks/tensor_latency.py --device cuda``, wall and host
   time per call, the container path beside the device codes, and the device codes'
   fixed cost per call;
5. ``gpu_check``: ``benchmarks/gpu_check.py`` (the container path's CPU/GPU byte
   identity, bounds and throughput) on a smaller throughput tensor;
6. ``activations``: ``benchmarks/activations.py --device cuda``, step time over plain,
   peak memory, activation reduction and validation loss for plain, checkpoint,
   save_on_cpu, tp block (existing path), tp device codes and tp quant, CNN and
   byte-level LM, on few steps.

The limits are estimates for an H100/H200, not measurements: a GPT-2-small step at
sequence 1024, batch 8, in bf16 takes about 50-100 ms there, a step on the paths with
host waits about a second (some 150 saved tensors at tensor_latency.py's per-call cost of a few
ms), plus numba's and Triton's compile times in each process; the compiled stage's
steps take milliseconds, its two inductor compiles (forward and backward each) most of
its 110 s; ``gpt2_memory.py`` trains until its budget's last 50 s, which the batch
search gets, and stops 20 s inside its stage's limit. The stages print as they go
(unbuffered), the most important numbers of each first, so a stage stopped at its limit
still leaves them.

Then a summary: each stage's status and seconds, and under it the stage's target lines
(``MET`` / ``NOT MET``; for ``compiled`` also the two compiled rows of its table). The
tables to record in benchmarks/RESULTS.md are the ones stages 2-6 print.

    python benchmarks/gpu_all.py                     # on a CUDA machine
    python benchmarks/gpu_all.py --out logs          # each stage's log, and summary.txt
    python benchmarks/gpu_all.py --only compiled     # some stages (--list: the plan)
    python benchmarks/gpu_all.py --cpu-dry-run       # no CUDA: the same stages, tiny, on the CPU

Exit status: 0 every stage passed, 1 some stage failed, ran over or did not start, 2 no
CUDA device (without ``--cpu-dry-run``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/test_device_codes.py",
    "tests/test_device_blocks.py",
    "tests/test_device_activations.py",
    "tests/test_device_offload.py",
    "tests/test_store_bounds.py",
    "tests/test_device_compile.py",
    "tests/test_device_gelu_kernels.py",
]

TOTAL_S = 9 * 60  # the whole run, seconds: one command within a brief GPU slot
GPT2_TINY = ["--layers", "2", "--width", "64", "--heads", "4", "--seq", "64", "--batch", "4"]
GPT2_TINY += ["--steps", "4", "--turn", "4", "--warmup", "1", "--val-batches", "2"]
GPT2_TINY += ["--max-batch", "4", "--store-gib", "0.25", "--budget-s", "540", "--search-s", "240"]
GPT2 = "benchmarks/gpt2_memory.py"
#: compiled.py's contenders: eager for reference, inductor, and the codes inside its graphs
COMPILED = ["benchmarks/compiled.py", "--only", "eager", "compile", "tp compiled"]
#: the compiled stage's lines for the summary: the two compiled rows and the targets
COMPILED_KEEP = r"^\| (compile|tp compiled) \||\bMET\b|not measured"
#: how long a stage's output may still flow after it ended or was stopped, seconds
DRAIN_S = 10


@dataclass
class Stage:
    """One command of the run: ``key`` names it for ``--only``; ``limit`` is its time
    limit, seconds; output lines matching ``keep`` are repeated in the summary."""

    key: str
    title: str
    cmd: list[str]
    limit: int
    keep: str = r"\bMET\b"


@dataclass
class Result:
    """How a stage ended: ``rc`` its exit status (None: stopped at its limit, -1: did
    not start), ``seconds`` taken, the ``kept`` output lines."""

    stage: Stage
    rc: int | None
    seconds: float
    kept: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        if self.rc is None:
            return "ran over"
        return "ok" if self.rc == 0 else "did not start" if self.rc == -1 else f"exit {self.rc}"


def stages(dry: bool) -> list[Stage]:
    """The stages in order, most important first; ``dry``: tiny, on the CPU."""
    # in one process, one test at a time (the ini's -n needs pytest-xdist, and one GPU)
    tests = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-rs", "-m", "not slow"]
    tests += ["-k", "cuda", *TESTS]
    # the CNN's digits come from scikit-learn (the bench extra): without it, the LM only
    only = [] if importlib.util.find_spec("sklearn") else ["--only", "lm"]
    return _dry_stages(tests, only) if dry else _gpu_stages(tests, only)


def _dry_stages(tests: list[str], only: list[str]) -> list[Stage]:
    py = sys.executable
    return [
        Stage("tests", "cuda tests (skip without CUDA)", tests, 120),
        Stage("gpt2_memory", "gpt2_memory", [py, GPT2, "--device", "cpu", *GPT2_TINY], 600),
        Stage(
            "compiled",
            "compiled training",
            [py, *COMPILED, "--device", "cpu", "--steps", "5", "--layers", "1"]
            + ["--width", "64", "--heads", "2", "--seq", "64", "--batch", "2"],
            600,
            COMPILED_KEEP,
        ),
        Stage(
            "tensor_latency",
            "tensor_latency",
            [py, "benchmarks/tensor_latency.py", "--device", "cpu", "--sizes", "64"]
            + ["--runs", "3"],
            120,
        ),
        # the synthetic arrays only, as on a GPU machine without the (uncommitted) corpus
        Stage(
            "gpu_check",
            "gpu_check",
            [py, "benchmarks/gpu_check.py", "--cpu-dry-run", "--corpus-dir"]
            + [str(ROOT / "benchmarks" / ".cache" / "no-corpus")],
            300,
        ),
        Stage(
            "activations",
            "activations",
            [py, "benchmarks/activations.py", "--device", "cpu", "--quick", *only]
            + ["--lm-batch", "8"],
            600,
        ),
    ]


def _gpu_stages(tests: list[str], only: list[str]) -> list[Stage]:
    py = sys.executable
    return [
        Stage("tests", "cuda tests under sync debug mode", tests, 85),
        Stage(
            "gpt2_memory",
            "gpt2_memory",
            [py, GPT2, "--markdown", "--budget-s", "135", "--search-s", "50"],
            155,
        ),
        # the CPU table's model (6 layers, width 384, seq 256), batch 8: two inductor
        # compiles (forward and backward each) take most of the limit
        Stage(
            "compiled",
            "compiled training",
            [py, *COMPILED, "--device", "cuda", "--steps", "30", "--batch", "8"],
            110,
            COMPILED_KEEP,
        ),
        Stage(
            "tensor_latency",
            "tensor_latency",
            [py, "benchmarks/tensor_latency.py", "--device", "cuda"]
            + ["--sizes", "64", "1024", "16384", "65536", "--runs", "10"],
            45,
        ),
        Stage(
            "gpu_check",
            "gpu_check",
            [py, "benchmarks/gpu_check.py", "--size-mib", "128", "--runs", "3"],
            75,
        ),
        Stage(
            "activations",
            "activations",
            [py, "benchmarks/activations.py", "--device", "cuda", "--markdown"]
            + ["--steps-cnn", "20", "--steps-lm", "20", *only],
            70,
        ),
    ]


def _relay(stream, log, keep: re.Pattern, kept: list[str]) -> None:
    """Pass a stage's output lines through to stdout and ``log``; keep the matching ones."""
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()
        if log is not None and not log.closed:  # closed: the stage's drain time ran out
            log.write(line)
            log.flush()
        if keep.search(line):
            kept.append(line.rstrip())


def _stop_group(proc: subprocess.Popen) -> None:
    """Kill the stage's process group: its workers (inductor's compile pool, pytest's)
    too, so that none holds the GPU or the output pipe into the next stage."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_stage(stage: Stage, log_path: Path | None = None) -> Result:
    """Run ``stage`` in the repository root in a process group of its own, its output
    passed through (and written to ``log_path``), stopped at its limit. Never raises
    for the stage's sake: a failure is the result's status."""
    print(f"\n===== {stage.title}: {shlex.join(stage.cmd[1:])} (at most {stage.limit} s) =====")
    sys.stdout.flush()
    started, kept = time.perf_counter(), []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # lines arrive as printed, kept if stopped
    log = open(log_path, "w") if log_path is not None else None  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            stage.cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", start_new_session=True,
        )  # fmt: skip
    except OSError as e:
        print(f"{stage.key} did not start: {e}")
        if log is not None:
            log.close()
        return Result(stage, -1, time.perf_counter() - started, [f"did not start: {e}"])
    relay = threading.Thread(
        target=_relay, args=(proc.stdout, log, re.compile(stage.keep), kept), daemon=True
    )
    relay.start()
    try:
        rc = proc.wait(timeout=stage.limit)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        _stop_group(proc)  # on a limit, an interrupt, or workers left behind
        proc.wait()
        relay.join(DRAIN_S)
        if log is not None:
            log.close()
    return Result(stage, rc, time.perf_counter() - started, kept)


def summary(results: list[Result], seconds: float) -> str:
    """Each stage's status, seconds and kept lines, then the total."""
    lines = ["===== summary ====="]
    for r in results:
        lines.append(f"{r.stage.title:36} {r.status:13} {r.seconds:6.0f} s")
        lines += [f"    {k}" for k in r.kept[-12:]]
    lines.append(f"{'total':36} {'':13} {seconds:6.0f} s")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-dry-run", action="store_true", help="no CUDA: tiny runs on the CPU")
    keys = [s.key for s in stages(dry=False)]
    p.add_argument("--only", nargs="+", choices=keys, metavar="STAGE", help=", ".join(keys))
    p.add_argument("--out", type=Path, help="folder for each stage's log and summary.txt")
    p.add_argument("--list", action="store_true", help="print the stages and exit")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    planned = [s for s in stages(args.cpu_dry_run) if not args.only or s.key in args.only]
    if args.list:
        for s in planned:
            print(f"{s.key:15} {s.limit:4d} s  {shlex.join(s.cmd[1:])}")
        return 0
    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("no CUDA device (use --cpu-dry-run to check the stages on the CPU)")
        return 2
    if not args.cpu_dry_run and sum(s.limit for s in planned) > TOTAL_S:
        print(f"the stage limits add up to more than {TOTAL_S} s: shorten one")
        return 1
    if torch.cuda.is_available():
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    results, started = [], time.perf_counter()
    for k, stage in enumerate(planned):
        log = args.out / f"{k + 1}-{stage.key}.log" if args.out is not None else None
        results.append(run_stage(stage, log))
    text = summary(results, time.perf_counter() - started)
    print("\n" + text, end="")
    if args.out is not None:
        _write(args.out / "summary.txt", text)
    return 0 if all(r.rc == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
