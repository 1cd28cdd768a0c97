"""The compiled HDF5 plugin against the in-process filter and hdf5plugin, on one large file.

The data: one float32 dataset of ``--size-mib`` MiB (default 1024), rows of 4096 values
in HDF5 chunks of 64 rows (1 MiB): a smooth field (sums of sines along both axes) plus
1% noise, written once under ``benchmarks/.cache/plugin_read/``. The bound: ``--rel``
(default 1e-3) times the value range, as an absolute bound for every contender.

  write   ``h5repack -f UD=...`` of the uncompressed file: tensorpress ``block`` through
          the compiled plugin (UD=32100) against hdf5plugin's SZ3 (UD=32024), end to end
  read    ``ds[...]`` of the whole dataset through h5py, timed inside a subprocess:
            plugin       the compiled plugin on HDF5_PLUGIN_PATH, tensorpress never imported
            in-process   ``import tensorpress`` (its ctypes filter), no plugin path
            SZ3, Zstd    ``import hdf5plugin`` (SZ3 at the same bound; Zstd lossless)
          and the ``block`` file written with a ``pw_rel`` bound of ``--rel``, read by the
          plugin and in process. Each read then checks its values against the input.

Every contender runs ``--repeat`` times (default 3), interleaved, the order rotated each
round; the table gives medians, MB = 1e6 bytes of float32 input, and the ratios with
their targets (MET / NOT MET).

    python benchmarks/plugin_read.py                   # 1 GiB, 3 rounds
    python benchmarks/plugin_read.py --size-mib 64     # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / ".cache" / "plugin_read"
PLUGIN_DIR = ROOT / "formats" / "hdf5_plugin"
COLS, CHUNK_ROWS = 4096, 64
NAME = "field"

READ = r"""
import json, sys, time
kind, path = sys.argv[1], sys.argv[2]
if kind == "in-process":
    import tensorpress  # registers the ctypes filter
elif kind in ("SZ3", "Zstd"):
    import hdf5plugin  # registers its filters
import h5py
t0, c0 = time.perf_counter(), time.process_time()
with h5py.File(path, "r") as f:
    x = f["field"][...]
t1, c1 = time.perf_counter(), time.process_time()
assert (kind == "in-process") == ("tensorpress" in sys.modules)
import numpy as np
np.save(sys.argv[3], x[:: max(1, x.shape[0] // 64)])  # rows for the error check
print(json.dumps({"s": t1 - t0, "cpu": c1 - c0}))
"""


def field_rows(start: int, stop: int, rng) -> np.ndarray:
    """Rows ``start:stop`` of the field: smooth in both axes, plus noise of 1% of its
    amplitude (float32)."""
    i = np.arange(start, stop, dtype=np.float64)[:, None]
    j = np.arange(COLS, dtype=np.float64)[None, :]
    x = np.sin(i / 700.0) * np.cos(j / 300.0) + 0.5 * np.sin((i + 2 * j) / 1500.0)
    return (x + 0.01 * rng.standard_normal(x.shape)).astype(np.float32)


def build_input(size_mib: int) -> tuple[Path, float]:
    """The uncompressed chunked file (cached) and the field's value range."""
    rows = max(CHUNK_ROWS, size_mib * (1 << 20) // (COLS * 4) // CHUNK_ROWS * CHUNK_ROWS)
    path = CACHE / f"input_{rows}x{COLS}.h5"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        rng = np.random.default_rng(0)
        with h5py.File(tmp, "w") as f:
            ds = f.create_dataset(NAME, (rows, COLS), "f4", chunks=(CHUNK_ROWS, COLS))
            for a in range(0, rows, 4096):
                ds[a : a + 4096] = field_rows(a, min(rows, a + 4096), rng)
        os.replace(tmp, path)
    lo = hi = 0.0
    with h5py.File(path) as f:
        for a in range(0, f[NAME].shape[0], 4096):
            x = f[NAME][a : a + 4096]
            lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    return path, hi - lo


def words(v: float) -> tuple[int, int]:
    """A float64 as two 32-bit words, low first (the cd_values layout)."""
    return struct.unpack("<II", struct.pack("<d", v))


def writers(tol: float, rel: float) -> dict:
    """h5repack's ``-f`` value and HDF5_PLUGIN_PATH of each writer."""
    import hdf5plugin

    block_abs = ",".join(map(str, (2, 2, 1, *words(tol))))
    block_pw = ",".join(map(str, (2, 2, 2, *words(rel))))
    sz3 = hdf5plugin.SZ3(absolute=tol)
    zstd = hdf5plugin.Zstd()
    return {
        "block": (f"UD=32100,0,5,{block_abs}", str(PLUGIN_DIR)),
        "block pw_rel": (f"UD=32100,0,5,{block_pw}", str(PLUGIN_DIR)),
        "SZ3": (
            f"UD={sz3.filter_id},0,{len(sz3.filter_options)},"
            + ",".join(map(str, sz3.filter_options)),
            hdf5plugin.PLUGIN_PATH,
        ),
        "Zstd": (
            f"UD={zstd.filter_id},0,{len(zstd.filter_options)},"
            + ",".join(map(str, zstd.filter_options)),
            hdf5plugin.PLUGIN_PATH,
        ),
    }


def env_with(plugin_path: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HDF5_PLUGIN")}
    if plugin_path is not None:
        env["HDF5_PLUGIN_PATH"] = plugin_path
    return env


def repack(src: Path, dst: Path, ud: str, plugin_path: str) -> float:
    """Seconds of ``h5repack -f ud src dst`` (written to a temporary name, renamed)."""
    tmp = dst.with_suffix(".tmp")
    t0 = time.perf_counter()
    done = subprocess.run(
        ["h5repack", "-f", ud, str(src), str(tmp)],
        capture_output=True,
        text=True,
        env=env_with(plugin_path),
    )
    seconds = time.perf_counter() - t0
    if done.returncode != 0 or done.stderr.strip():
        raise SystemExit(f"h5repack {ud} failed: {done.stderr.strip()[-500:]}")
    os.replace(tmp, dst)
    return seconds


def read(kind: str, path: Path, sample: Path) -> dict:
    """One timed whole-dataset read in a subprocess (see READ)."""
    plugin = str(PLUGIN_DIR) if kind == "plugin" else None
    argv = [
        sys.executable,
        "-c",
        READ,
        "in-process" if kind == "in-process" else kind,
        str(path),
        str(sample),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env_with(plugin))
    if done.returncode != 0:
        raise SystemExit(f"read {kind} {path.name} failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def max_error(src: Path, sample: Path) -> np.ndarray:
    """|decoded - input| of the sampled rows (every element of them)."""
    got = np.load(sample).astype(np.float64)
    with h5py.File(src) as f:
        step = max(1, f[NAME].shape[0] // 64)
        want = f[NAME][::step].astype(np.float64)
    return np.abs(got - want)


def interleaved(jobs: dict, repeat: int) -> dict:
    """{name: [result per round]}, the jobs run in an order rotated each round."""
    out = {name: [] for name in jobs}
    names = list(jobs)
    for r in range(repeat):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out[name].append(jobs[name]())
    return out


def bench(args) -> dict:
    src, span = build_input(args.size_mib)
    tol = args.rel * span
    with h5py.File(src) as f:
        nbytes = f[NAME].size * 4
    ws = writers(tol, args.rel)
    files = {name: CACHE / f"{name.replace(' ', '_')}_{src.stem}.h5" for name in ws}
    writes = interleaved(
        {name: (lambda n=name: repack(src, files[n], *ws[n])) for name in ("block", "SZ3")},
        args.repeat,
    )
    for name in ("block pw_rel", "Zstd"):
        repack(src, files[name], *ws[name])
    sample = CACHE / "sample.npy"
    contenders = {
        "plugin": ("plugin", files["block"]),
        "in-process": ("in-process", files["block"]),
        "SZ3": ("SZ3", files["SZ3"]),
        "Zstd": ("Zstd", files["Zstd"]),
        "plugin pw_rel": ("plugin", files["block pw_rel"]),
        "in-process pw_rel": ("in-process", files["block pw_rel"]),
    }
    errors = {}

    def job(name):
        kind, path = contenders[name]
        res = read(kind, path, sample)
        err = max_error(src, sample)
        if name.endswith("pw_rel"):
            with h5py.File(src) as f:
                x = np.abs(f[NAME][:: max(1, f[NAME].shape[0] // 64)].astype(np.float64))
            errors[name] = float(np.max(err / (args.rel * x + 1e-300)))
        else:
            errors[name] = float(err.max() / tol) if name != "Zstd" else float(err.max())
        return res

    reads = interleaved({name: (lambda n=name: job(n)) for name in contenders}, args.repeat)
    sizes = {
        name: files[w].stat().st_size
        for name, w in (
            ("block", "block"),
            ("SZ3", "SZ3"),
            ("Zstd", "Zstd"),
            ("block pw_rel", "block pw_rel"),
        )
    }
    return {
        "mb": nbytes / 1e6,
        "tol": tol,
        "rel": args.rel,
        "repeat": args.repeat,
        "write_s": {k: statistics.median(v) for k, v in writes.items()},
        "read_s": {k: statistics.median(r["s"] for r in v) for k, v in reads.items()},
        "read_cpu": {k: statistics.median(r["cpu"] for r in v) for k, v in reads.items()},
        "errors": errors,
        "ratios": {k: nbytes / v for k, v in sizes.items()},
    }


def report(res: dict) -> str:
    mb = res["mb"]
    lines = [
        f"{mb:.0f} MB float32, bound abs = {res['rel']:g} x range = {res['tol']:.4g}; "
        f"medians of {res['repeat']}; {platform.machine()}, {os.cpu_count()} cores",
        "",
        "| contender | file | ratio | read MB/s (per CPU s) | max err / bound |",
        "|---|---|---:|---:|---:|",
    ]
    files = {
        "plugin": "block",
        "in-process": "block",
        "SZ3": "SZ3",
        "Zstd": "Zstd",
        "plugin pw_rel": "block pw_rel",
        "in-process pw_rel": "block pw_rel",
    }
    for name, f in files.items():
        s, cpu = res["read_s"][name], res["read_cpu"][name]
        err = res["errors"][name]
        lines.append(
            f"| {name} | {f} | {res['ratios'][f]:.2f} | {mb / s:.0f} ({mb / cpu:.0f}) | {err:.3f} |"
        )
    w = res["write_s"]
    lines += ["", f"h5repack write MB/s: block {mb / w['block']:.0f}, SZ3 {mb / w['SZ3']:.0f}", ""]
    r = res["read_s"]
    targets = [
        ("plugin read / in-process read (abs)", r["in-process"] / r["plugin"], 1.0),
        (
            "plugin read / in-process read (pw_rel)",
            r["in-process pw_rel"] / r["plugin pw_rel"],
            1.0,
        ),
        ("plugin read / hdf5plugin SZ3 read", r["SZ3"] / r["plugin"], 1.3),
        ("h5repack block write / SZ3 write", w["SZ3"] / w["block"], 1.0),
    ]
    lines += ["| ratio | value | target | |", "|---|---:|---:|---|"]
    for what, v, target in targets:
        lines.append(
            f"| {what} | {v:.2f} | >= {target:g} | {'MET' if v >= target else 'NOT MET'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=1024, help="input MiB (default 1024)")
    p.add_argument("--rel", type=float, default=1e-3, help="bound: rel x range (default 1e-3)")
    p.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    args = p.parse_args(argv)
    print(report(bench(args)))


if __name__ == "__main__":
    main()
