"""The compiled HDF5 plugin's `sz` predictors against the in-process filter, per predictor.

One float32 dataset per kind of data, each about ``--size-mib`` MiB (default 32), written
through the in-process filter with ``sz`` at an absolute bound of ``--rel`` (default 1e-3)
times its value range, its predictor chosen per chunk by ``auto``:

  waves 3-d    sines along every axis, chunks of 16 x 128 x 128 (multi-dim. interpolation)
  waves rows   the same field as rows of 512, chunks of 512 rows (interpolation)
  ripple 3-d   a smooth field with a grid-scale ripple, chunks of 2**19 values (fitted)
  tokens       rows of 512 that nearly repeat, chunks of 2048 rows (row match)
  low rank     rows of 512 in a 30-dimensional space, chunks of 2048 rows, a tenth of
               the bound (pivots)

Each dataset is read whole with h5py in a subprocess, twice, the second read timed
inside it (warm: numba's kernels loaded, the library opened): ``plugin`` (the
compiled plugin on HDF5_PLUGIN_PATH, tensorpress never imported) and ``in-process``
(``import tensorpress``, its ctypes filter, the numba kernels); both must return the same
bytes. ``--repeat`` rounds (default 3), the two interleaved and their order alternated;
medians. MB = 1e6 bytes of float32 output. The table names the predictor ids the chunks
hold.

    python benchmarks/plugin_sz_predictors.py
    python benchmarks/plugin_sz_predictors.py --size-mib 8 --repeat 2   # quick
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = ROOT / "formats" / "hdf5_plugin"

READ = r"""
import hashlib, json, sys, time
kind, path, name = sys.argv[1:4]
if kind == "in-process":
    import tensorpress  # registers the ctypes filter
import h5py
with h5py.File(path, "r") as f:
    f[name][...]  # warm: numba's kernels loaded, the plugin's library opened
    t0 = time.perf_counter()
    x = f[name][...]
    t1 = time.perf_counter()
assert (kind == "in-process") == ("tensorpress" in sys.modules)
print(json.dumps({"s": t1 - t0, "bytes": x.nbytes, "sha": hashlib.sha256(x.tobytes()).hexdigest()}))
"""


def _waves(n0: int) -> np.ndarray:
    i, j, k = np.meshgrid(np.arange(n0), np.arange(256), np.arange(256), indexing="ij")
    x = np.sin(i / 7.0) * np.cos(j / 5.0) + 0.5 * np.sin((k + i) / 9.0)
    return x.astype(np.float32)


def datasets(mib: int) -> dict:
    """name: (values, chunks[, the bound's factor])."""
    rng = np.random.default_rng(0)
    planes = max(16, mib * (1 << 20) // (4 * 256 * 256) // 16 * 16)
    rows = max(2048, mib * (1 << 20) // (4 * 512) // 2048 * 2048)
    waves = _waves(planes)
    ripple = rng.standard_normal((planes, 256, 256)).cumsum(axis=2).cumsum(axis=1)
    ripple *= 1 + 0.2 * (-1.0) ** np.arange(256)
    table = rng.standard_normal((6, 512))
    tokens = table[rng.integers(0, 6, rows)] + 0.02 * rng.standard_normal((rows, 512))
    coords = rng.standard_normal((rows, 30)) * 0.8 ** np.arange(30)
    low = coords @ rng.standard_normal((30, 512)) + 1e-3 * rng.standard_normal((rows, 512))
    return {
        "waves 3-d": (waves, (16, 128, 128)),
        "waves rows": (waves.reshape(-1, 512), (512, 512)),
        "ripple 3-d": (ripple.astype(np.float32), (8, 256, 256)),
        "tokens": (tokens.astype(np.float32), (2048, 512)),
        "low rank": (low.astype(np.float32), (2048, 512), 0.1),
    }


def predictor_ids(dset) -> list[int]:
    from tensorpress.compress.zstd import zstd_decompress
    from tensorpress.formats import read_header

    ids = set()
    for i in range(dset.id.get_num_chunks()):
        blob = dset.id.read_direct_chunk(dset.id.get_chunk_info(i).chunk_offset)[1]
        h = read_header(blob)
        for o, n in zip(h.offsets, h.lengths, strict=True):
            ids.add(zstd_decompress(blob[o : o + n], 1 << 31)[0])
    return sorted(ids)


def read(kind: str, path: Path, name: str, plugin_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HDF5_")}
    if kind == "plugin":
        env["HDF5_PLUGIN_PATH"] = str(plugin_dir)
    done = subprocess.run(
        [sys.executable, "-c", READ, kind, str(path), name],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _build_module():
    """formats/hdf5_plugin/build.py, loaded by its path as setuptools loads it."""
    spec = importlib.util.spec_from_file_location("_tp_plugin_build", PLUGIN_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=32)
    ap.add_argument("--rel", type=float, default=1e-3)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    from tensorpress.formats import hdf5_filter

    build = _build_module()

    with tempfile.TemporaryDirectory() as tmp:
        plugin_dir = build.build_library(Path(tmp) / "plugin").parent
        path = Path(tmp) / "sz.h5"
        sets = datasets(args.size_mib)
        with h5py.File(path, "w") as f:
            for name, (x, chunks, *factor) in sets.items():
                eb = args.rel * (factor or [1.0])[0] * float(x.max() - x.min())
                f.create_dataset(
                    name, data=x, chunks=chunks, **hdf5_filter.filter(codec="sz", abs=eb)
                )
        with h5py.File(path) as f:
            ids = {name: predictor_ids(f[name]) for name in sets}
        print("| data | predictor ids | MB | plugin MB/s | in-process MB/s | plugin / in-process |")
        print("|---|---|---|---|---|---|")
        for name in sets:
            times = {"plugin": [], "in-process": []}
            shas = set()
            for r in range(args.repeat):
                order = ("plugin", "in-process") if r % 2 == 0 else ("in-process", "plugin")
                for kind in order:
                    out = read(kind, path, name, plugin_dir)
                    times[kind].append(out["s"])
                    shas.add(out["sha"])
            assert len(shas) == 1, f"{name}: the plugin and the filter disagree"
            mb = sets[name][0].nbytes / 1e6
            p, q = (statistics.median(times[k]) for k in ("plugin", "in-process"))
            print(
                f"| {name} | {ids[name]} | {mb:.0f} | {mb / p:.0f} | {mb / q:.0f} | {q / p:.2f}x |"
            )


if __name__ == "__main__":
    main()
