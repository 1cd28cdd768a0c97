"""CPU microseconds per chunk read by the loader's datasets, page cache warm: what a miss
costs besides the disk. Reads the copies ``benchmarks/loader.py`` made (run it first):

  raw 4/chunk      ``H5Dataset`` over the uncompressed file, one 4-sample chunk per read
  block HDF5       the ``block`` copy through the filter, one sample per chunk
  block zarr       the ``block`` zarr store, one sample per chunk
  block HDF5 4/chunk  ``compress_file``'s copy, one 4-sample chunk per read

Each row: ``time.thread_time`` per read over ``--reads`` random chunks (the same ones
for every row), median of ``--repeats`` passes, the rows interleaved pass by pass; and
per sample. For a before/after comparison run it twice on the same machine (another
checkout on ``PYTHONPATH``), in turn.

    python benchmarks/loader_chunk_cost.py [--size-mib 2048] [--reads 800] [--repeats 7]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

CACHE = Path(__file__).parent / ".cache" / "loader"


def _datasets(size_mib: int) -> dict:
    from tensorpress.loaders import H5Dataset, ZarrDataset

    n = size_mib * 4  # samples of 256 KiB
    stem = f"loader-{n}x65536-f32-c4"
    files = {
        "raw 4/chunk": (H5Dataset, f"{stem}.h5", 4),
        "block HDF5": (H5Dataset, f"{stem}-block-rel0.001-filter1.h5", 1),
        "block zarr": (ZarrDataset, f"{stem}-block-rel0.001.zarr", 1),
        "block HDF5 4/chunk": (H5Dataset, f"{stem}-block-rel0.001-1.h5", 4),
    }
    out = {}
    for name, (cls, file, per) in files.items():
        if not (CACHE / file).exists():
            raise SystemExit(f"{CACHE / file} is missing: run benchmarks/loader.py first")
        out[name] = (cls(CACHE / file, "x"), per)
    return out


def _pass(ds, per: int, starts: np.ndarray, out: np.ndarray) -> float:
    """CPU microseconds per read of the chunks at ``starts``."""
    t0 = time.thread_time()
    for s in starts.tolist():
        ds.read_range(s, s + per, out=out)
    return (time.thread_time() - t0) / starts.size * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--reads", type=int, default=800)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    sets = _datasets(args.size_mib)
    rng = np.random.default_rng(0)
    chunks = rng.choice(args.size_mib, args.reads, replace=False)  # 4-sample chunks
    outs = {k: np.empty((per, 65536), np.float32) for k, (_, per) in sets.items()}
    for k, (ds, per) in sets.items():  # warm: page cache, numba, headers
        _pass(ds, per, chunks * 4, outs[k])
    times: dict[str, list[float]] = {k: [] for k in sets}
    for _ in range(args.repeats):
        for k, (ds, per) in sets.items():
            times[k].append(_pass(ds, per, chunks * 4, outs[k]))
    print(f"| dataset | CPU us / read | CPU us / sample | ({args.reads} reads, median of "
          f"{args.repeats}) |\n|---|--:|--:|---|")  # fmt: skip
    for k, (_, per) in sets.items():
        med = float(np.median(times[k]))
        lo, hi = min(times[k]), max(times[k])
        print(f"| {k} | {med:.1f} | {med / per:.1f} | {lo:.1f}..{hi:.1f} |")


if __name__ == "__main__":
    main()
