"""HDF5 compression side by side on a large file: the ``tensorpress compress`` command
(filter layout, 1 and 2 workers), tensorpress's HDF5 filter written from h5py
(``create_dataset(**tensorpress.hdf5.filter(abs=...))``), and h5py + hdf5plugin's SZ3
(absolute bound) and Zstd filters, all read back through h5py.

The data: an HDF5 file of ``--size-gb`` GB (1 GB = 1e9 bytes; default 1.0) built from
the benchmark corpus (``corpus.py``) and cached under ``benchmarks/.cache/cli/``: four
float32 datasets of about a quarter of the size each, in groups,

  simulated/grayscott   Gray-Scott U and V volumes (96^3), stacked along axis 0
  simulated/turbulence  the 128^3 k^-11/3 Gaussian random field, stacked
  images/smooth         the smooth 1024^2 field, stacked into (n, 1024, 1024)
  dl/relu               the CNN's ReLU output (N, C, H, W), concatenated along N

Copy ``k`` of an array is rolled by ``17 k`` along its last axes, mirrored when ``k`` is
odd and scaled by ``1 + 0.05 (k mod 7)``, so that no two copies are the same bytes.

Every write and read is a subprocess, ``--repeat`` times (default 2; medians), with its
peak resident memory (``ru_maxrss`` from ``os.wait4``). For each bound ``--rel``
(default 1e-3 and 1e-4; the peers get ``abs = rel * value range`` of each dataset):

  write      ``python -m tensorpress.cli compress --layout filter --workers W`` end to
             end (interpreter start, imports and the range pass included); the h5py
             writers likewise: a range pass, then slabs of whole chunks through h5py.
             All use the same HDF5 chunks: whole rows, about 4 MiB (the CLI's default).
  full read  every dataset's ``ds[...]`` through h5py in a process that imported
             tensorpress (or hdf5plugin), timed inside it, then checked against the
             input (max error / bound)
  slices     ``--slices`` (default 200) random hyperslabs through h5py, each one or two
             chunks of rows and half of every other axis: median ms per slice and MB/s

Beside each MB/s, in parentheses, MB per CPU second of the process (``ru_utime +
ru_stime``; ``time.process_time`` for reads), which time spent waiting for a core on a
shared machine does not change. A ``--layout stream`` row (the previous layout, 1
worker) is kept for reference. Zstd is lossless, so it runs once. MB = 1e6 bytes of the
original float32 values.

    python benchmarks/cli.py --markdown --repeat 3     # 1 GB, rel 1e-3 and 1e-4
    python benchmarks/cli.py --small                   # quick: 0.05 GB, rel 1e-3, 1 run
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
H5_CHUNK_BYTES = 4 << 20  # HDF5 chunk of every output: the CLI's default --chunk
#: dataset path -> the corpus arrays whose copies fill it
LAYOUT = {
    "simulated/grayscott": ("grayscott_u", "grayscott_v"),
    "simulated/turbulence": ("kolmogorov_grf",),
    "images/smooth": ("smooth_2d",),
    "dl/relu": ("cnn_relu1_out",),
}
#: the h5py writers: name -> what the table calls them
PEERS = {
    "tp-h5py": "tensorpress filter via h5py",
    "sz3": "h5py + hdf5plugin.SZ3",
    "zstd": "h5py + hdf5plugin.Zstd",
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


def slabs(shape, itemsize, slab_bytes=SLAB_BYTES, rows_multiple=1):
    """Row ranges of about ``slab_bytes``, each a multiple of ``rows_multiple`` rows."""
    rows = max(1, slab_bytes // max(1, math.prod(shape[1:]) * itemsize))
    rows = max(rows_multiple, rows - rows % rows_multiple)
    for a in range(0, shape[0], rows):
        yield slice(a, min(a + rows, shape[0]))


def chunks_for(shape, itemsize) -> tuple:
    """Whole rows, about 4 MiB: the chunks ``tensorpress compress --chunk 4M`` picks."""
    rows = max(1, min(shape[0], H5_CHUNK_BYTES // max(1, math.prod(shape[1:]) * itemsize)))
    return (rows, *shape[1:])


def value_range(ds) -> tuple[float, float]:
    lo, hi = math.inf, -math.inf
    for s in slabs(ds.shape, ds.dtype.itemsize):
        x = ds[s]
        lo, hi = min(lo, float(x.min())), max(hi, float(x.max()))
    return lo, hi


def import_filters(kind: str) -> None:
    """What a reader of ``kind``'s files imports: tensorpress or hdf5plugin."""
    if kind.startswith("tp"):
        import tensorpress  # noqa: F401 - registers the tensorpress filter
    else:
        import hdf5plugin  # noqa: F401 - registers SZ3 and Zstd


def filter_keywords(kind: str, eb: float) -> dict:
    if kind == "tp-h5py":
        import tensorpress

        hdf5 = getattr(tensorpress, "hdf5", None)
        if hdf5 is None:  # before the public name exists
            from tensorpress.formats import hdf5_filter as hdf5
        return hdf5.filter(abs=eb)
    import hdf5plugin

    return {"compression": hdf5plugin.SZ3(absolute=eb) if kind == "sz3" else hdf5plugin.Zstd()}


# --------------------------------------------------------------------------- helpers run as
# subprocesses (``python benchmarks/cli.py _write|_read ...``)


def h5write(kind: str, src: str, dst: str, rel: float) -> dict:
    """Copy every float dataset of ``src`` through h5py with ``kind``'s filter (absolute
    bound ``rel * value range``), slabs of whole chunks at a time."""
    import h5py

    bounds = {}
    with h5py.File(src, "r") as fi, h5py.File(dst, "w") as fo:
        for name, (shape, dtype) in float_datasets(src).items():
            ds = fi[name]
            lo, hi = value_range(ds) if kind != "zstd" else (0.0, 0.0)
            bounds[name] = eb = rel * (hi - lo)
            chunks = chunks_for(shape, dtype.itemsize)
            out = fo.create_dataset(
                name, shape=shape, dtype=dtype, chunks=chunks, **filter_keywords(kind, eb)
            )
            for s in slabs(shape, dtype.itemsize, rows_multiple=chunks[0]):
                out[s] = ds[s]
    return {"bounds": bounds}


def h5read(kind: str, src: str, dst: str, bounds: dict, n_slices: int, check: bool) -> dict:
    """Read every dataset of ``dst`` with ``[...]`` (timed) and, if ``check``, compare it
    with ``src``; then ``n_slices`` random hyperslabs (timed one by one)."""
    import h5py

    import_filters(kind)
    names = float_datasets(src)
    seconds, cpu, worst = 0.0, 0.0, {}
    with h5py.File(src, "r") as fi, h5py.File(dst, "r") as fo:
        for name, (shape, dtype) in names.items():
            t0, c0 = time.perf_counter(), time.process_time()
            y = fo[name][...]
            seconds += time.perf_counter() - t0
            cpu += time.process_time() - c0
            err = 0.0
            for s in slabs(shape, dtype.itemsize) if check else ():
                err = max(err, float(np.abs(fi[name][s].astype(np.float64) - y[s]).max()))
            worst[name] = err / bounds[name] if bounds[name] else err
            del y
        rng = np.random.default_rng(0)
        order = sorted(names)
        times, nbytes = [], 0
        for i in range(n_slices):
            ds = fo[order[i % len(order)]]
            rows = ds.chunks[0]
            a = int(rng.integers(0, ds.shape[0]))
            sel = [slice(a, min(ds.shape[0], a + int(rng.integers(1, rows + 1))))]
            for d in ds.shape[1:]:
                b = int(rng.integers(0, d - d // 2 + 1))
                sel.append(slice(b, b + max(1, d // 2)))
            t0 = time.perf_counter()
            part = ds[tuple(sel)]
            times.append(time.perf_counter() - t0)
            nbytes += part.nbytes
    return {
        "read_seconds": seconds,
        "read_cpu_seconds": cpu,
        "max_error_over_bound": worst,
        "slice_ms": 1e3 * statistics.median(times),
        "slice_mb_s": nbytes / 1e6 / sum(times),
    }


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
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {stderr.strip()}")
    return {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "rss": usage.ru_maxrss * 1024,  # KiB on Linux
        "stdout": stdout,
    }


def tp_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "tensorpress.cli", *map(str, args), "--quiet", "--json"]


def me(*args) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *map(str, args)]


def repeated(cmd: list[str], repeat: int, first: list[str] | None = None) -> dict:
    """Medians over ``repeat`` runs of ``cmd`` (and of what its JSON stdout reports); when
    ``first`` is given, it runs instead of the first (its output is the "doc", its peak
    RSS counts only when it is the only run)."""
    runs = [run(first or cmd)] + [run(cmd) for _ in range(repeat - 1)]
    docs = [json.loads(r["stdout"]) if r["stdout"].strip().startswith("{") else {} for r in runs]
    out = {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
        "cpu_per_wall": statistics.median(r["cpu_seconds"] / r["seconds"] for r in runs),
        "rss": max(r["rss"] for r in (runs[1:] if first and repeat > 1 else runs)),
        "doc": docs[0],
    }
    for key in ("read_seconds", "read_cpu_seconds", "slice_ms", "slice_mb_s"):
        if key in docs[-1]:
            out[key] = statistics.median(d[key] for d in docs)
    return out


def warm_up(work: Path, src: Path) -> None:
    """Compile (numba cache) and import once, untimed, on a small copy of each dataset."""
    import h5py

    small = work / "warm.h5"
    with h5py.File(src, "r") as fi, h5py.File(small, "w") as fo:
        for name in float_datasets(src):
            fo.create_dataset(name, data=fi[name][:4])
    comp = work / "warm-c.h5"
    run(tp_cmd("compress", small, comp, "--rel", "1e-3", "--layout", "filter", "--force"))
    run(me("_read", "tp", small, comp, json.dumps(dict.fromkeys(float_datasets(src), 1.0)), 4, 1))


def reads(kind: str, src: Path, dst: Path, bounds: dict, args) -> dict:
    """The read subprocesses of ``dst``: the first also checks the values against ``src``."""
    cmd = me("_read", kind, src, dst, json.dumps(bounds), args.slices)
    return repeated([*cmd, "0"], args.repeat, first=[*cmd, "1"])


def file_digest(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def output_chunks(path: Path) -> dict:
    import h5py

    with h5py.File(path, "r") as f:
        return {n: tuple(f[n].chunks) for n in float_datasets(path)}


def bench(args) -> dict:
    import h5py

    t0 = time.perf_counter()
    src = build_file(int(args.size_gb * 1e9))
    built = time.perf_counter() - t0
    datasets = float_datasets(src)
    original = sum(math.prod(s) * d.itemsize for s, d in datasets.values())
    with h5py.File(src, "r") as f:
        ranges = {n: value_range(f[n]) for n in datasets}
    want_chunks = {n: chunks_for(s, d.itemsize) for n, (s, d) in datasets.items()}
    work = Path(tempfile.mkdtemp(prefix="cli-bench-", dir=CACHE))
    results = {
        "file": str(src),
        "file_bytes": src.stat().st_size,
        "original_bytes": original,
        "build_seconds": built,
        "chunks": {n: list(c) for n, c in want_chunks.items()},
        "rows": [],
    }
    mb = original / 1e6

    def add(row: dict, w: dict | None, r: dict | None, dst: Path) -> None:
        row["ratio"] = results["file_bytes"] / dst.stat().st_size
        if w is not None:
            row |= {"write_mb_s": mb / w["seconds"], "write_rss": w["rss"]}
            row["write_cpu_per_wall"] = w["cpu_per_wall"]
            row["write_mb_cpu_s"] = mb / w["cpu_seconds"]
        if r is not None:
            row |= {"read_mb_s": mb / r["read_seconds"], "read_rss": r["rss"]}
            row["read_mb_cpu_s"] = mb / r["read_cpu_seconds"]
            row |= {"slice_ms": r["slice_ms"], "slice_mb_s": r["slice_mb_s"]}
            row["max_error_over_bound"] = max(r["doc"]["max_error_over_bound"].values())
        results["rows"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)

    try:
        warm_up(work, src)
        results["load_before"] = os.getloadavg()
        for i, rel in enumerate(args.rel):
            bounds = {n: rel * (hi - lo) for n, (lo, hi) in ranges.items()}
            dst = work / "tp.h5"
            digests = set()
            for workers in args.workers:
                cmd = tp_cmd("compress", src, dst, "--rel", rel, "--layout", "filter")
                w = repeated([*cmd, "--workers", str(workers), "--force"], args.repeat)
                if output_chunks(dst) != want_chunks:
                    raise RuntimeError(f"the CLI wrote chunks {output_chunks(dst)}")
                digests.add(file_digest(dst))
                r = None
                if workers == args.workers[0]:  # the bytes do not depend on the workers
                    r = reads("tp", src, dst, bounds, args)
                add({"rel": rel, "what": "tensorpress compress", "workers": workers}, w, r, dst)
            results["rows"][-1]["same_bytes"] = len(digests) == 1
            if args.stream:  # the previous layout, for reference: a uint8 stream per dataset
                cmd = tp_cmd("compress", src, dst, "--rel", rel, "--layout", "stream")
                w = repeated([*cmd, "--workers", "1", "--force"], args.repeat)
                add({"rel": rel, "what": "tensorpress --layout stream", "workers": 1}, w, None, dst)
            for kind in args.peers:
                if kind == "zstd" and i:
                    continue  # lossless: once
                dst = work / f"{kind}.h5"
                w = repeated(me("_write", kind, src, dst, rel), args.repeat)
                got = w["doc"]["bounds"]
                r = reads(kind, src, dst, got, args)
                what = PEERS[kind]
                add({"rel": None if kind == "zstd" else rel, "what": what, "workers": 1}, w, r, dst)
                dst.unlink()
        results["load_after"] = os.getloadavg()
    finally:
        if not args.keep:
            for p in work.iterdir():
                p.unlink()
            work.rmdir()
    return results


# --------------------------------------------------------------------------- printing


def header(results: dict) -> str:
    import h5py

    try:
        import hdf5plugin

        plugin = f"hdf5plugin {hdf5plugin.version}"
    except ImportError:
        plugin = "hdf5plugin not installed"
    ds = float_datasets(results["file"])
    shapes = "; ".join(
        f"{n} {'x'.join(map(str, s))} (chunks {'x'.join(map(str, results['chunks'][n]))})"
        for n, (s, _) in ds.items()
    )
    return (
        f"python {platform.python_version()}, numpy {np.__version__}, h5py {h5py.__version__} "
        f"(HDF5 {h5py.version.hdf5_version}), {plugin}, {os.cpu_count()} cpus\n"
        f"file: {Path(results['file']).name}, {results['file_bytes'] / 1e9:.3f} GB, "
        f"float32: {shapes}\n"
        "load average (1 min) before / after: "
        f"{results['load_before'][0]:.1f} / {results['load_after'][0]:.1f}"
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


def versus(row: dict, sz3: dict | None) -> str:
    """ratio / write / full read of ``row`` over hdf5plugin SZ3's at the same bound."""
    if sz3 is None or row is sz3:
        return "-"
    read = "=" if "same_bytes" in row else "-"
    if "read_mb_s" in row:
        read = f"{row['read_mb_s'] / sz3['read_mb_s']:.2f}"
    return (
        f"{row['ratio'] / sz3['ratio']:.2f} / {row['write_mb_s'] / sz3['write_mb_s']:.2f} / {read}"
    )


def read_note(row: dict) -> str:
    if "same_bytes" in row:
        return "same bytes" if row["same_bytes"] else "BYTES DIFFER"
    return "(not h5py)"


def report(results: dict, markdown: bool) -> str:
    mib = 2**20
    sz3 = {r["rel"]: r for r in results["rows"] if r["what"] == PEERS["sz3"]}
    rows = []
    for r in results["rows"]:
        read = "read_mb_s" in r
        rows.append(
            [
                "lossless" if r["rel"] is None else f"{r['rel']:g}",
                r["what"],
                r["workers"],
                f"{r['ratio']:.2f}",
                f"{r['write_mb_s']:.0f} ({r['write_mb_cpu_s']:.0f})",
                f"{r['write_rss'] / mib:.0f}",
                f"{r['read_mb_s']:.0f} ({r['read_mb_cpu_s']:.0f})" if read else read_note(r),
                f"{r['read_rss'] / mib:.0f}" if read else "",
                f"{r['slice_ms']:.1f}" if read else "",
                f"{r['slice_mb_s']:.0f}" if read else "",
                f"{r['max_error_over_bound']:.3f}" if read else "",
                versus(r, sz3.get(r["rel"])),
            ]
        )
    headers = [
        "rel",
        "writer",
        "workers",
        "ratio",
        "write MB/s (per CPU s)",
        "write RSS MiB",
        "full read MB/s (per CPU s)",
        "read RSS MiB",
        "slice ms",
        "slice MB/s",
        "max err / bound",
        "vs SZ3: ratio / write / read",
    ]
    return "\n".join([header(results), "", table(headers, rows, markdown)])


def main(argv=None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_write"]:
        print(json.dumps(h5write(argv[1], argv[2], argv[3], float(argv[4]))))
        return
    if argv[:1] == ["_read"]:
        bounds, slices, check = json.loads(argv[4]), int(argv[5]), argv[6] == "1"
        print(json.dumps(h5read(argv[1], argv[2], argv[3], bounds, slices, check)))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-gb", type=float, default=1.0, help="file size, GB = 1e9 bytes")
    p.add_argument("--small", action="store_true", help="quick: 0.05 GB, rel 1e-3, 1 run")
    p.add_argument("--rel", type=float, action="append", help="bounds (default 1e-3, 1e-4)")
    p.add_argument("--workers", default="1,2", help="CLI worker counts (default 1,2)")
    p.add_argument("--repeat", type=int, default=2, help="runs per measurement (median)")
    p.add_argument("--slices", type=int, default=200, help="random hyperslabs read")
    p.add_argument("--markdown", action="store_true", help="markdown tables")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--no-hdf5plugin", action="store_true", help="skip the hdf5plugin rows")
    p.add_argument("--keep", action="store_true", help="keep the outputs")
    p.add_argument(
        "--no-stream", dest="stream", action="store_false", help="skip the stream-layout row"
    )
    args = p.parse_args(argv)
    if args.small:
        args.size_gb, args.rel, args.repeat = 0.05, args.rel or [1e-3], 1
    args.rel = args.rel or [1e-3, 1e-4]
    args.workers = [int(w) for w in args.workers.split(",")]
    if args.repeat < 1 or args.size_gb <= 0 or args.slices < 1:
        p.error("--repeat and --slices must be >= 1 and --size-gb > 0")
    args.peers = ["tp-h5py", "sz3", "zstd"]
    if not args.no_hdf5plugin:
        try:
            import hdf5plugin  # noqa: F401
        except ImportError:
            print("hdf5plugin not installed: its rows are skipped", file=sys.stderr)
            args.no_hdf5plugin = True
    if args.no_hdf5plugin:
        args.peers = ["tp-h5py"]
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
