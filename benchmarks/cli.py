"""Command line benchmark: ``tensorpress compress / decompress / verify`` end to end on a
large HDF5 file, as subprocesses, beside h5py + hdf5plugin's SZ3 filter.

The data: an HDF5 file of ``--size-gb`` GB (1 GB = 1e9 bytes; default 1.0) built from
the benchmark corpus (``corpus.py``) and cached under ``benchmarks/.cache/cli/``: four
float32 datasets of about a quarter of the size each, in groups,

  simulated/grayscott   Gray-Scott U and V volumes (96^3), stacked along axis 0
  simulated/turbulence  the 128^3 k^-11/3 Gaussian random field, stacked
  images/smooth         the smooth 1024^2 field, stacked into (n, 1024, 1024)
  dl/relu               the CNN's ReLU output (N, C, H, W), concatenated along N

Copy ``k`` of an array is rolled by ``17 k`` along its last axes, mirrored when ``k`` is
odd and scaled by ``1 + 0.05 (k mod 7)``, so that no two copies are the same bytes.

Each run is a subprocess (``python -m tensorpress.cli ... --quiet --json``): for every
bound ``--rel`` (default 1e-3 and 1e-4) and worker count (1 and 2), ``compress`` and
``decompress`` ``--repeat`` times (default 2; medians), then ``verify`` once. Reported:
the compression ratio (file bytes in / out), end-to-end MB/s (the original bytes over
the subprocess's wall time, interpreter start and imports included; MB = 1e6 bytes),
the speed-up of 2 workers over 1, and the peak resident memory of each subprocess
(``ru_maxrss`` from ``os.wait4``) against the file size: the tool streams, so it stays
far below. The input is read from the page cache (the machine's memory holds it).

Beside it, in the same run: h5py + hdf5plugin's SZ3 filter copying the same datasets
(``hdf5plugin.SZ3(absolute=rel * value range)``, the range of each whole dataset, chunks
of about 4 MiB, one slab of chunks at a time), and reading the copy back (with the max
error against the bound), also as subprocesses.

    python benchmarks/cli.py                       # 1 GB, rel 1e-3 and 1e-4
    python benchmarks/cli.py --size-gb 0.2 --rel 1e-3 --repeat 2
    python benchmarks/cli.py --markdown
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:
    from corpus import load_corpus
except ImportError:  # imported as benchmarks.cli
    from benchmarks.corpus import load_corpus

CACHE = Path(__file__).resolve().parent / ".cache" / "cli"
FILE_VERSION = 1
SLAB_BYTES = 64 << 20  # bytes written or compared at a time by the helpers here
H5_CHUNK_BYTES = 4 << 20  # HDF5 chunk of the hdf5plugin copy
#: dataset path -> the corpus arrays whose copies fill it
LAYOUT = {
    "simulated/grayscott": ("grayscott_u", "grayscott_v"),
    "simulated/turbulence": ("kolmogorov_grf",),
    "images/smooth": ("smooth_2d",),
    "dl/relu": ("cnn_relu1_out",),
}


# --------------------------------------------------------------------------- the data


def variant(x: np.ndarray, k: int) -> np.ndarray:
    """Copy ``k`` of ``x``: rolled along the last axes, mirrored if k is odd, scaled."""
    axes = tuple(range(max(0, x.ndim - 2), x.ndim))
    y = np.roll(x, shift=[17 * k] * len(axes), axis=axes)
    if k % 2:
        y = y[..., ::-1]
    return (y * np.float32(1 + 0.05 * (k % 7))).astype(np.float32)


def build_file(size_bytes: int) -> Path:
    """The benchmark HDF5 file of at least ``size_bytes`` bytes of float32 (cached)."""
    import h5py

    path = CACHE / f"cli-v{FILE_VERSION}-{size_bytes / 1e9:g}gb.h5"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    names = sorted({n for arrays in LAYOUT.values() for n in arrays})
    corpus = load_corpus(names, verbose=True)
    per_dataset = size_bytes / len(LAYOUT)
    tmp = path.with_suffix(f".tmp{os.getpid()}.h5")
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["description"] = "tensorpress CLI benchmark: tiled benchmark-corpus arrays"
            for dpath, arrays in LAYOUT.items():
                parts = [corpus[a] for a in arrays]
                unit = sum(p.nbytes for p in parts)
                copies = math.ceil(per_dataset / unit) * len(parts)
                first = parts[0]
                if first.ndim == 2:  # images: planes of a 3-d dataset
                    rows, shape = 1, (copies, *first.shape)
                else:  # volumes and N,C,H,W tensors: concatenated along axis 0
                    rows, shape = first.shape[0], (copies * first.shape[0], *first.shape[1:])
                ds = f.create_dataset(dpath, shape=shape, dtype=np.float32)
                ds.attrs["source"] = ", ".join(arrays)
                for k in range(copies):
                    block = variant(parts[k % len(parts)], k)
                    ds[k * rows : (k + 1) * rows] = block.reshape((rows, *shape[1:]))
                print(f"  {dpath}: {shape} float32, {ds.nbytes / 1e9:.3f} GB", file=sys.stderr)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def float_datasets(path) -> dict:
    """name -> (shape, dtype) of the float datasets of an HDF5 file."""
    import h5py

    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda n, o: (
                out.__setitem__(n, (o.shape, o.dtype))
                if isinstance(o, h5py.Dataset) and o.dtype.kind == "f"
                else None
            )
        )
    return out


def slabs(shape, itemsize, slab_bytes=SLAB_BYTES):
    rows = max(1, slab_bytes // max(1, math.prod(shape[1:]) * itemsize))
    for a in range(0, shape[0], rows):
        yield slice(a, min(a + rows, shape[0]))


# --------------------------------------------------------------------------- helpers run as
# subprocesses (``python benchmarks/cli.py _h5copy ...``): hdf5plugin's SZ3 filter


def h5copy(src: str, dst: str, rel: float) -> dict:
    """Copy every float dataset of ``src`` through hdf5plugin.SZ3(absolute=rel * range)."""
    import h5py
    import hdf5plugin

    bounds = {}
    with h5py.File(src, "r") as fi, h5py.File(dst, "w") as fo:
        for name, (shape, dtype) in float_datasets(src).items():
            ds = fi[name]
            lo, hi = math.inf, -math.inf
            for s in slabs(shape, dtype.itemsize):
                x = ds[s]
                lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
            eb = rel * (hi - lo)
            bounds[name] = eb
            chunk_rows = max(1, H5_CHUNK_BYTES // (math.prod(shape[1:]) * dtype.itemsize))
            out = fo.create_dataset(
                name,
                shape=shape,
                dtype=dtype,
                chunks=(min(chunk_rows, shape[0]), *shape[1:]),
                compression=hdf5plugin.SZ3(absolute=eb),
            )
            for s in slabs(shape, dtype.itemsize):
                out[s] = ds[s]
    return {"bounds": bounds}


def h5check(src: str, dst: str, bounds: dict) -> dict:
    """Read every dataset of the hdf5plugin copy back; max error / bound per dataset."""
    import h5py
    import hdf5plugin  # noqa: F401 - registers the filter

    worst = {}
    with h5py.File(src, "r") as fi, h5py.File(dst, "r") as fo:
        for name, (shape, dtype) in float_datasets(src).items():
            err = 0.0
            for s in slabs(shape, dtype.itemsize):
                y = fo[name][s]
                err = max(err, float(np.abs(fi[name][s].astype(np.float64) - y).max()))
            worst[name] = err / bounds[name]
    return {"max_error_over_bound": worst}


# --------------------------------------------------------------------------- measuring


def run(cmd: list[str]) -> dict:
    """Run ``cmd``; its wall seconds, peak RSS (bytes), exit status and stdout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {stderr.strip()}")
    return {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "rss": usage.ru_maxrss * 1024,  # KiB on Linux
        "rc": proc.returncode,
        "stdout": stdout,
    }


def tp_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "tensorpress.cli", *map(str, args), "--quiet", "--json"]


def repeated(cmd: list[str], repeat: int) -> dict:
    runs = [run(cmd) for _ in range(repeat)]
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "all_seconds": [r["seconds"] for r in runs],
        "cpu_per_wall": statistics.median(r["cpu_seconds"] / r["seconds"] for r in runs),
        "rss": max(r["rss"] for r in runs),
        "stdout": runs[-1]["stdout"],
        "rc": runs[-1]["rc"],
    }


def warm_up(work: Path) -> int:
    """Compile (numba cache) and import once, untimed; the peak RSS (bytes) of compressing
    a 256 KiB array: what the interpreter and its imports take, whatever the file size."""
    x = np.cumsum(np.random.default_rng(0).standard_normal((256, 256)), 0).astype(np.float32)
    np.save(work / "warm.npy", x)
    compress = tp_cmd("compress", work / "warm.npy", work / "warm.tp", "--rel", "1e-3", "--force")
    run(compress)
    run(tp_cmd("decompress", work / "warm.tp", work / "warm-back.npy", "--force"))
    return run(compress)["rss"]


def bench(args) -> dict:
    size = int(args.size_gb * 1e9)
    t0 = time.perf_counter()
    src = build_file(size)
    built = time.perf_counter() - t0
    file_bytes = src.stat().st_size
    original = sum(math.prod(s) * d.itemsize for s, d in float_datasets(src).values())
    work = Path(tempfile.mkdtemp(prefix="cli-bench-", dir=CACHE))
    comp, back, h5c = work / "c.h5", work / "back.h5", work / "sz3.h5"
    results = {
        "file": str(src),
        "file_bytes": file_bytes,
        "original_bytes": original,
        "build_seconds": built,
        "tp": [],
        "verify": [],
        "hdf5plugin": [],
    }
    try:
        results["baseline_rss"] = warm_up(work)
        results["load_before"] = os.getloadavg()
        for rel in args.rel:
            for workers in args.workers:
                c = repeated(
                    tp_cmd("compress", src, comp, "--rel", rel, "--workers", workers, "--force"),
                    args.repeat,
                )
                d = repeated(
                    tp_cmd("decompress", comp, back, "--workers", workers, "--force"), args.repeat
                )
                results["tp"].append(
                    {
                        "rel": rel,
                        "workers": workers,
                        "ratio": file_bytes / comp.stat().st_size,
                        "compressed_bytes": comp.stat().st_size,
                        "compress_mb_s": original / 1e6 / c["seconds"],
                        "decompress_mb_s": original / 1e6 / d["seconds"],
                        "compress_seconds": c["all_seconds"],
                        "decompress_seconds": d["all_seconds"],
                        "compress_rss": c["rss"],
                        "decompress_rss": d["rss"],
                        "compress_cpu_per_wall": c["cpu_per_wall"],
                        "decompress_cpu_per_wall": d["cpu_per_wall"],
                    }
                )
                print(json.dumps(results["tp"][-1]), file=sys.stderr, flush=True)
            v = run(tp_cmd("verify", src, comp))
            doc = json.loads(v["stdout"])
            results["verify"].append(
                {
                    "rel": rel,
                    "ok": doc["ok"],
                    "rc": v["rc"],
                    "seconds": v["seconds"],
                    "mb_s": original / 1e6 / v["seconds"],
                    "rss": v["rss"],
                    "max_rel_error": max(d["max_rel_error"] or 0 for d in doc["datasets"]),
                    "min_psnr_db": min(
                        (d["psnr_db"] for d in doc["datasets"] if d["psnr_db"] is not None),
                        default=None,
                    ),
                }
            )
            print(json.dumps(results["verify"][-1]), file=sys.stderr, flush=True)
            if not args.no_hdf5plugin:
                results["hdf5plugin"].append(bench_hdf5plugin(src, h5c, rel, original, args))
                print(json.dumps(results["hdf5plugin"][-1]), file=sys.stderr, flush=True)
        results["load_after"] = os.getloadavg()
    finally:
        if not args.keep:
            for p in work.iterdir():
                p.unlink()
            work.rmdir()
    return results


def bench_hdf5plugin(src: Path, dst: Path, rel: float, original: int, args) -> dict:
    me = [sys.executable, str(Path(__file__).resolve())]
    c = repeated([*me, "_h5copy", str(src), str(dst), str(rel)], args.repeat)
    bounds = json.loads(c["stdout"])["bounds"]
    d = repeated([*me, "_h5check", str(src), str(dst), json.dumps(bounds)], args.repeat)
    worst = json.loads(d["stdout"])["max_error_over_bound"]
    return {
        "rel": rel,
        "ratio": src.stat().st_size / dst.stat().st_size,
        "compress_mb_s": original / 1e6 / c["seconds"],
        "read_check_mb_s": original / 1e6 / d["seconds"],
        "compress_rss": c["rss"],
        "read_rss": d["rss"],
        "max_error_over_bound": max(worst.values()),
    }


# --------------------------------------------------------------------------- printing


def header(results: dict) -> str:
    import h5py

    try:
        import hdf5plugin

        plugin = f"hdf5plugin {hdf5plugin.version}"
    except ImportError:
        plugin = "hdf5plugin not installed"
    ds = float_datasets(results["file"])
    shapes = "; ".join(f"{n} {'x'.join(map(str, s))}" for n, (s, _) in ds.items())
    return (
        f"python {platform.python_version()}, numpy {np.__version__}, h5py {h5py.__version__} "
        f"(HDF5 {h5py.version.hdf5_version}), {plugin}, {os.cpu_count()} cpus\n"
        f"file: {Path(results['file']).name}, {results['file_bytes'] / 1e9:.3f} GB "
        f"({results['file_bytes'] / 2**20:.0f} MiB), float32: {shapes}"
    )


def table(headers: list[str], rows: list[list], markdown: bool) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if markdown:
        lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"]
        lines.append("| " + " | ".join("-" * (w - 1) + ":" for w in widths) + " |")
        lines += [
            "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |"
            for r in cells
        ]
    else:
        lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def report(results: dict, markdown: bool) -> str:
    size = results["file_bytes"]
    mib = 2**20
    out = [header(results), ""]
    one = {(r["rel"]): r for r in results["tp"] if r["workers"] == 1}
    rows = []
    for r in results["tp"]:
        base = one.get(r["rel"])
        rows.append(
            [
                f"{r['rel']:g}",
                r["workers"],
                f"{r['ratio']:.2f}",
                f"{r['compress_mb_s']:.0f}",
                f"{r['compress_mb_s'] / base['compress_mb_s']:.2f}x" if base else "-",
                f"{r['decompress_mb_s']:.0f}",
                f"{r['decompress_mb_s'] / base['decompress_mb_s']:.2f}x" if base else "-",
                f"{r['compress_cpu_per_wall']:.2f} / {r['decompress_cpu_per_wall']:.2f}",
                f"{r['compress_rss'] / mib:.0f} ({r['compress_rss'] / size:.3f})",
                f"{r['decompress_rss'] / mib:.0f} ({r['decompress_rss'] / size:.3f})",
            ]
        )
    out.append(
        "load average (1 min) before / after: "
        f"{results['load_before'][0]:.1f} / {results['load_after'][0]:.1f}; peak RSS of "
        f"compressing a 256 KiB array (interpreter and imports): "
        f"{results['baseline_rss'] / mib:.0f} MiB"
    )
    out.append("")
    out.append("tensorpress compress / decompress, end to end (median of runs; MB = 1e6 bytes)")
    out.append("")
    out.append(
        table(
            [
                "rel",
                "workers",
                "ratio",
                "comp MB/s",
                "vs 1 worker",
                "dec MB/s",
                "vs 1 worker",
                "CPU s / wall s (comp / dec)",
                "comp peak RSS MiB (/ file)",
                "dec peak RSS MiB (/ file)",
            ],
            rows,
            markdown,
        )
    )
    out += ["", "tensorpress verify (one run)", ""]
    out.append(
        table(
            ["rel", "result", "MB/s", "max rel error", "min PSNR dB", "peak RSS MiB (/ file)"],
            [
                [
                    f"{v['rel']:g}",
                    "ok (exit 0)" if v["ok"] else f"FAILED (exit {v['rc']})",
                    f"{v['mb_s']:.0f}",
                    f"{v['max_rel_error']:.3g}",
                    "-" if v["min_psnr_db"] is None else f"{v['min_psnr_db']:.1f}",
                    f"{v['rss'] / mib:.0f} ({v['rss'] / size:.3f})",
                ]
                for v in results["verify"]
            ],
            markdown,
        )
    )
    if results["hdf5plugin"]:
        out += [
            "",
            "side by side: tensorpress (1 worker) and h5py + hdf5plugin SZ3 (one thread)",
            "",
        ]
        rows = []
        for h in results["hdf5plugin"]:
            t = one.get(h["rel"])
            if t:
                rows.append(
                    [
                        f"{h['rel']:g}",
                        "tensorpress sz, 1 worker",
                        f"{t['ratio']:.2f}",
                        f"{t['compress_mb_s']:.0f}",
                        f"{t['decompress_mb_s']:.0f}",
                        f"{t['compress_rss'] / mib:.0f}",
                        "<= 1 (verify)",
                    ]
                )
            rows.append(
                [
                    f"{h['rel']:g}",
                    "h5py + hdf5plugin.SZ3",
                    f"{h['ratio']:.2f}",
                    f"{h['compress_mb_s']:.0f}",
                    f"{h['read_check_mb_s']:.0f}",
                    f"{h['compress_rss'] / mib:.0f}",
                    f"{h['max_error_over_bound']:.3f}",
                ]
            )
        out.append(
            table(
                [
                    "rel",
                    "what",
                    "ratio",
                    "comp MB/s",
                    "dec MB/s",
                    "comp peak RSS MiB",
                    "max err / bound",
                ],
                rows,
                markdown,
            )
        )
        out.append(
            "\n(hdf5plugin's decompress MB/s is a read of every dataset that also compares it "
            "with the original; its compress copies slab by slab through h5py)"
        )
    return "\n".join(out)


def main(argv=None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_h5copy"]:
        print(json.dumps(h5copy(argv[1], argv[2], float(argv[3]))))
        return
    if argv[:1] == ["_h5check"]:
        print(json.dumps(h5check(argv[1], argv[2], json.loads(argv[3]))))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=1.0, help="file size, GB = 1e9 bytes")
    p.add_argument("--rel", type=float, action="append", help="bounds (default 1e-3, 1e-4)")
    p.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    p.add_argument("--repeat", type=int, default=2, help="runs per measurement (median)")
    p.add_argument("--markdown", action="store_true", help="markdown tables")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--no-hdf5plugin", action="store_true", help="skip the hdf5plugin rows")
    p.add_argument("--keep", action="store_true", help="keep the compressed outputs")
    args = p.parse_args(argv)
    args.rel = args.rel or [1e-3, 1e-4]
    args.workers = [int(w) for w in args.workers.split(",")]
    if args.repeat < 1 or args.size_gb <= 0:
        p.error("--repeat must be >= 1 and --size-gb > 0")
    if not args.no_hdf5plugin:
        try:
            import hdf5plugin  # noqa: F401
        except ImportError:
            print("hdf5plugin not installed: its rows are skipped", file=sys.stderr)
            args.no_hdf5plugin = True
    t0 = time.perf_counter()
    results = bench(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(report(results, args.markdown))
    print(
        f"\n(total {time.perf_counter() - t0:.0f} s, "
        f"file built in {results['build_seconds']:.0f} s)"
    )


if __name__ == "__main__":
    main()
