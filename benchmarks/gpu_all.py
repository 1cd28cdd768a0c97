"""Everything a GPU must show, in one command that ends within 8 minutes.

GPU time is scarce, so this runs, in order, each stage with its own time
limit (a stage that runs over is stopped and reported, the next one still runs):

1. the CUDA tests of the device path (``tests/test_device_codes.py``,
   ``tests/test_device_activations.py``, ``-k cuda``): the Triton kernels against the
   torch reference, and compress/restore and a training step under
   ``torch.cuda.set_sync_debug_mode("error")`` (any host synchronisation raises);
2. ``benchmarks/gpu_check.py`` (the container path's CPU/GPU byte identity, bounds and
   throughput) on a smaller throughput tensor;
3. ``benchmarks/tensor_latency.py --device cuda``: wall and host time per call, the
   container path beside the device codes;
4. ``benchmarks/activations.py --device cuda``: step time over plain, peak memory,
   activation reduction and validation loss for plain, checkpoint, save_on_cpu, tp
   block (existing path), tp device codes and tp quant, CNN and byte-level LM.

Then a summary: each stage's exit status and seconds. The tables to record in
benchmarks/RESULTS.md are the ones stages 2-4 print.

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
TESTS = ["tests/test_device_codes.py", "tests/test_device_activations.py"]


def stages(dry: bool) -> list[tuple[str, list[str], int]]:
    """(name, command, seconds allowed) of each stage; ``dry``: tiny, on the CPU."""
    py = sys.executable
    # the CNN's digits come from scikit-learn (the bench extra): without it, the LM only
    only = [] if importlib.util.find_spec("sklearn") else ["--only", "lm"]
    tests = [py, "-m", "pytest", "-q", "-rs", "-k", "cuda", *TESTS]
    if dry:
        return [
            ("cuda tests (skip without CUDA)", tests, 120),
            ("gpu_check", [py, "benchmarks/gpu_check.py", "--cpu-dry-run"], 300),
            (
                "tensor_latency",
                [py, "benchmarks/tensor_latency.py", "--device", "cpu", "--sizes", "64"]
                + ["--runs", "3"],
                120,
            ),
            (
                "activations",
                [py, "benchmarks/activations.py", "--device", "cpu", "--quick", *only],
                300,
            ),
        ]
    return [
        ("cuda tests under sync debug mode", tests, 100),
        ("gpu_check", [py, "benchmarks/gpu_check.py", "--size-mib", "256", "--runs", "5"], 110),
        (
            "tensor_latency",
            [py, "benchmarks/tensor_latency.py", "--device", "cuda"]
            + ["--sizes", "64", "1024", "16384", "262144"],
            60,
        ),
        (
            "activations",
            [py, "benchmarks/activations.py", "--device", "cuda", "--markdown"]
            + ["--steps-cnn", "60", "--steps-lm", "40", *only],
            170,
        ),
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
    results = []
    for name, cmd, limit in stages(args.cpu_dry_run):
        results.append((name, *run_stage(name, cmd, limit)))
    print("\n===== summary =====")
    failed = False
    for name, rc, seconds in results:
        status = "ran over" if rc is None else "ok" if rc == 0 else f"exit {rc}"
        failed = failed or rc != 0
        print(f"{name:36} {status:10} {seconds:6.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
