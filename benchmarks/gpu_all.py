"""Everything a GPU must show, in one command that ends within 8 minutes.

GPU time is scarce, so this runs, most important first, each stage with its own time
limit (a stage that runs over is stopped and reported, the next one still runs; the
limits add up to at most ``TOTAL_S``, 8 minutes):

1. the CUDA tests of the device path (``TESTS``, ``-k cuda``): the Triton kernels
   against the torch reference; compress/restore, a training step, offloaded codes and
   a compiled step under ``torch.cuda.set_sync_debug_mode("error")`` (any host
   synchronisation raises);
2. ``benchmarks/gpt2_memory.py``: a GPT-2-small-shaped decoder (12 layers, width 768,
   sequence 1024, bf16 autocast) with plain, checkpoint, 2-bit quant, adaptive block,
   device codes and compressed offload: step time over plain, peak CUDA memory,
   activation reduction, validation loss change, and the largest batch under a 4 GiB
   cap; it keeps to its own time budget (``--budget-s``), under the stage's limit;
3. ``benchmarks/tensor_latency.py --device cuda``: wall and host time per call, the
   container path beside the device codes, and the device codes' fixed cost per call;
4. ``benchmarks/gpu_check.py`` (the container path's CPU/GPU byte identity, bounds and
   throughput) on a smaller throughput tensor;
5. ``benchmarks/activations.py --device cuda``: step time over plain, peak memory,
   activation reduction and validation loss for plain, checkpoint, save_on_cpu, tp
   block (existing path), tp device codes and tp quant, CNN and byte-level LM, on few
   steps;
6. ``benchmarks/compiled.py --device cuda``: plain eager, ``torch.compile`` and
   ``compile_with_compression`` (saved activations as codes inside inductor's graphs)
   on the GPT-2-shaped LM scaled down: saved bytes, peak memory, step time, loss.

The limits are estimates for an H200, not measurements: a GPT-2-small step at sequence
1024, batch 8, in bf16 takes about 50-100 ms there, a step on the paths with host waits
about a second (some 150 saved tensors at issue 30's per-call cost of a few ms), plus
numba's and Triton's compile times in each process; ``gpt2_memory.py`` trains until its
budget's last 50 s, which the batch search gets, and stops 20 s inside its stage's limit.
The stages print as they go, the most important numbers of each first, so a stage
stopped at its limit still leaves them.

Then a summary: each stage's exit status and seconds. The tables to record in
benchmarks/RESULTS.md are the ones stages 2-5 print.

    python benchmarks/gpu_all.py                # on a CUDA machine
    python benchmarks/gpu_all.py --cpu-dry-run  # no CUDA: the same stages, tiny, on the CPU

Exit status: 0 every stage passed, 1 some stage failed or ran over, 2 no CUDA device
(without ``--cpu-dry-run``).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
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


TOTAL_S = 8 * 60  # the whole run, seconds: short enough to fit a brief GPU slot
GPT2_TINY = ["--layers", "2", "--width", "64", "--heads", "4", "--seq", "64", "--batch", "4"]
GPT2_TINY += ["--steps", "4", "--turn", "4", "--warmup", "1", "--val-batches", "2"]
GPT2_TINY += ["--max-batch", "4", "--store-gib", "0.25", "--budget-s", "540", "--search-s", "240"]


def stages(dry: bool) -> list[tuple[str, list[str], int]]:
    """(name, command, seconds allowed) of each stage; ``dry``: tiny, on the CPU."""
    py = sys.executable
    # the CNN's digits come from scikit-learn (the bench extra): without it, the LM only
    only = [] if importlib.util.find_spec("sklearn") else ["--only", "lm"]
    # in one process, one test at a time (the ini's -n needs pytest-xdist, and one GPU)
    tests = [py, "-m", "pytest", "-o", "addopts=", "-q", "-rs", "-m", "not slow"]
    tests += ["-k", "cuda", *TESTS]
    gpt2 = [py, "benchmarks/gpt2_memory.py"]
    compiled = [py, "benchmarks/compiled.py", "--only", "eager", "compile", "tp compiled"]
    if dry:
        return [
            ("cuda tests (skip without CUDA)", tests, 120),
            (
                "gpt2_memory",
                [*gpt2, "--device", "cpu", *GPT2_TINY],
                600,
            ),
            (
                "tensor_latency",
                [py, "benchmarks/tensor_latency.py", "--device", "cpu", "--sizes", "64"]
                + ["--runs", "3"],
                120,
            ),
            # the synthetic arrays only, as on a GPU machine without the (uncommitted) corpus
            (
                "gpu_check",
                [py, "benchmarks/gpu_check.py", "--cpu-dry-run", "--corpus-dir"]
                + [str(ROOT / "benchmarks" / ".cache" / "no-corpus")],
                300,
            ),
            (
                "activations",
                [py, "benchmarks/activations.py", "--device", "cpu", "--quick", *only]
                + ["--lm-batch", "8"],
                600,
            ),
            (
                "compiled",
                [*compiled, "--device", "cpu", "--steps", "5", "--layers", "1", "--width", "64"]
                + ["--heads", "2", "--seq", "64", "--batch", "2"],
                600,
            ),
        ]
    return [
        ("cuda tests under sync debug mode", tests, 85),
        ("gpt2_memory", [*gpt2, "--markdown", "--budget-s", "135", "--search-s", "50"], 155),
        (
            "tensor_latency",
            [py, "benchmarks/tensor_latency.py", "--device", "cuda"]
            + ["--sizes", "64", "1024", "16384", "65536", "--runs", "10"],
            45,
        ),
        ("gpu_check", [py, "benchmarks/gpu_check.py", "--size-mib", "128", "--runs", "3"], 75),
        (
            "activations",
            [py, "benchmarks/activations.py", "--device", "cuda", "--markdown"]
            + ["--steps-cnn", "20", "--steps-lm", "20", *only],
            70,
        ),
        ("compiled", [*compiled, "--device", "cuda", "--steps", "12", "--batch", "8"], 50),
    ]


def run_stage(name: str, cmd: list[str], limit: int) -> tuple[int | None, float]:
    """Run ``cmd`` in the repository root, its output passed through; (exit status or
    None when it ran over ``limit`` seconds, seconds taken)."""
    print(f"\n===== {name}: {' '.join(cmd[1:])} (at most {limit} s) =====", flush=True)
    started = time.perf_counter()
    try:
        rc = subprocess.run(cmd, cwd=ROOT, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        rc = None
    return rc, time.perf_counter() - started


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-dry-run", action="store_true", help="no CUDA: tiny runs on the CPU")
    args = p.parse_args(argv)
    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("no CUDA device (use --cpu-dry-run to check the stages on the CPU)")
        return 2
    if torch.cuda.is_available():
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    planned = stages(args.cpu_dry_run)
    if not args.cpu_dry_run:
        assert sum(limit for *_, limit in planned) <= TOTAL_S, "stage limits exceed TOTAL_S"
    results = []
    started = time.perf_counter()
    for name, cmd, limit in planned:
        results.append((name, *run_stage(name, cmd, limit)))
    print("\n===== summary =====")
    failed = False
    for name, rc, seconds in results:
        status = "ran over" if rc is None else "ok" if rc == 0 else f"exit {rc}"
        failed = failed or rc != 0
        print(f"{name:36} {status:10} {seconds:6.0f} s")
    print(f"{'total':36} {'':10} {time.perf_counter() - started:6.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
