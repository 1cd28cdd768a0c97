"""GPU check of the torch paths of ``block`` and ``quant``: identity, bounds, throughput.

For every array (the corpus ``.npy`` files found in ``--corpus-dir``, cropped to
``--max-mib``, plus synthetic activations generated on the GPU with a fixed seed) in
float32, float16 and bfloat16, and for ``block`` at rel 1e-2, rel 1e-3, abs 1e-2 and
pw_rel 1e-2 (and ``quant`` at 2/4/8 bits, stochastic rounding with seed 3 or nearest,
hadamard on/off, when tensorpress has it), this compresses with ``compress_tensor``
on the GPU and on the CPU (the same data) and with ``tp.compress`` (numba; for
bfloat16, from an ``ml_dtypes.bfloat16`` array), checks that the payloads and container
bytes are identical, decodes each where it was made, checks the values are bitwise
identical and within the bound (NaN-aware; for quant: within the max error each chunk
records). Failures are counted, not raised; every case is a row of a per-array table.

Then, on a ``--size-mib`` activation tensor: median GB/s (input bytes / s) of 10
timed ``compress_tensor`` and ``decompress_tensor`` runs (``--runs``; 3 when a warm-up
takes over a second) after two warm-ups, the
ratio and the peak CUDA memory during compress as a multiple of the input bytes,
for block at rel 1e-2 and 1e-3 and quant at 2 and 4 bits.

    python benchmarks/gpu_check.py [--corpus-dir DIR] [--size-mib 1024] [--json OUT]
    python benchmarks/gpu_check.py --cpu-dry-run     # no CUDA: numba vs torch-CPU only
    python benchmarks/gpu_check.py --export-crops DIR  # cropped corpus to carry along

``--profile`` adds, for block at rel 1e-2 on the throughput tensor, torch.profiler's
device time per kernel of one compress and one decompress (numba.cuda kernels
included), and how much of the call's wall time the kernels fill.

Exit status: 0 all checks passed, 1 some check failed (identity, bound, or an exception
in a case or a throughput run), 2 no CUDA device (without ``--cpu-dry-run``).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

DEFAULT_CORPUS_DIR = Path(__file__).resolve().parent / ".cache" / "corpus-v1"
BLOCK_BOUNDS = (("rel", 1e-2), ("rel", 1e-3), ("abs", 1e-2), ("pw_rel", 1e-2))
#: (bits, hadamard, stochastic); stochastic rounding uses seed 3
QUANT_CONFIGS = [(b, h, True) for b in (2, 4, 8) for h in (False, True)] + [
    (4, False, False),
    (4, True, False),
]
QUANT_SEED = 3
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: chunk size of the identity cases: small and odd, so arrays span chunks with a tail
IDENTITY_CHUNK_BYTES = 300_000
SEED = 0
THROUGHPUT_CASES = (
    ("block rel=1e-2", {"codec": "block", "rel": 1e-2}),
    ("block rel=1e-3", {"codec": "block", "rel": 1e-3}),
    ("quant bits=2", {"codec": "quant", "bits": 2}),
    ("quant bits=4", {"codec": "quant", "bits": 4}),
)
SLOW_RUN_S = 1.0  # a warm-up (compress + decompress) slower than this: 3 timed runs


# --------------------------------------------------------------------------- data


def _crop(x: np.ndarray, max_bytes: int) -> np.ndarray:
    """A leading corner of ``x`` of at most ``max_bytes``: the first of each leading axis
    (dropped) until the rest fits, then as many rows of that as fit (so it spans chunks)."""
    for axis in range(x.ndim):
        inner = math.prod(x.shape[axis + 1 :]) * x.itemsize
        if inner <= max_bytes:
            rows = x[(0,) * axis][: max(1, max_bytes // inner)]
            return np.ascontiguousarray(rows)
    return np.ascontiguousarray(x.reshape(-1)[: max(1, max_bytes // x.itemsize)])


def load_corpus_arrays(corpus_dir: Path, max_bytes: int) -> dict[str, np.ndarray]:
    """The ``.npy`` files in ``corpus_dir`` (sorted by name, cropped); none if it is absent."""
    if not corpus_dir.is_dir():
        return {}
    out = {}
    for path in sorted(corpus_dir.glob("*.npy")):
        try:
            x = np.load(path)
        except Exception:  # noqa: BLE001 - unreadable files are skipped like missing ones
            continue
        if x.dtype.kind == "f" and x.size:
            out[path.stem] = _crop(x.astype(np.float32, copy=False), max_bytes)
    return out


def _smooth_field(g: torch.Generator, shape: tuple, device) -> torch.Tensor:
    """A random N,C,H,W field blurred by a 5x5 Gaussian per channel, unit std."""
    c = shape[1]
    z = torch.randn(shape, generator=g, device=device)
    k = torch.exp(-(torch.arange(-2.0, 3.0, device=device) ** 2) / 2)
    k = (k[:, None] * k[None, :]) / k.sum() ** 2
    y = torch.nn.functional.conv2d(z, k.expand(c, 1, 5, 5).contiguous(), padding=2, groups=c)
    del z
    return y / y.std()


def synthetic_arrays(device, max_bytes: int) -> dict[str, torch.Tensor]:
    """ReLU and GELU activations and Gaussian gradients, float32, made on ``device``."""
    g = torch.Generator(device=device).manual_seed(SEED)
    elems = max(4096, max_bytes // 4)
    hw = 64
    n_img = max(1, elems // (16 * hw * hw))
    relu = torch.relu(_smooth_field(g, (n_img, 16, hw, hw), device) - 0.3)
    gelu = torch.nn.functional.gelu(
        2.0 * _smooth_field(g, (n_img, 16, hw, hw), device) - 0.5
    ).reshape(n_img * 16, hw * hw)
    rows = max(1, elems // 1000)
    grads = 1e-3 * torch.randn((rows, 1000), generator=g, device=device)
    return {"syn_relu_field": relu, "syn_gelu": gelu, "syn_gauss_grad": grads}


def large_activation(device, size_mib: int) -> torch.Tensor:
    """A ``size_mib`` MiB float32 ReLU activation (B, 16, 128, 128), B = size_mib."""
    g = torch.Generator(device=device).manual_seed(SEED + 1)
    parts = [
        torch.relu(_smooth_field(g, (min(64, size_mib - b), 16, 128, 128), device) - 0.3)
        for b in range(0, size_mib, 64)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


# --------------------------------------------------------------------------- checks


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _max_err(x: torch.Tensor, y: torch.Tensor) -> float:
    """Max |x - y| over the elements finite in ``x`` (float64)."""
    x64, y64 = x.double(), y.double()
    fin = torch.isfinite(x64)
    return float((x64 - y64).abs()[fin].max()) if bool(fin.any()) else 0.0


def within_bound(x: torch.Tensor, y: torch.Tensor, mode: str, tol: float) -> bool:
    """NaN where x is NaN, infinities kept, and |x - y| <= tol (times |x| for pw_rel)."""
    x64, y64 = x.double(), y.double()
    if not torch.equal(torch.isnan(x64), torch.isnan(y64)):
        return False
    inf = torch.isinf(x64)
    if not torch.equal(x64[inf], y64[inf]):
        return False
    fin = torch.isfinite(x64)
    err = (x64 - y64).abs()[fin]
    lim = tol * x64.abs()[fin] if mode == "pw_rel" else tol
    return bool((err <= lim).all())


def within_reported(x: torch.Tensor, y: torch.Tensor, ct) -> bool:
    """quant: every chunk's error at most the max error its payload records."""
    from tensorpress.compress.quant.codec import QuantCodec

    payload = bytes(ct.payload.cpu().numpy())
    per = ct.chunk_rows * (math.prod(ct.shape[1:]) if len(ct.shape) else 1)
    xf, yf = x.reshape(-1).double(), y.reshape(-1).double()
    both_nan = torch.isnan(xf) & torch.isnan(yf)
    err = torch.where(both_nan, 0.0, (xf - yf).abs())
    err = torch.where(xf == yf, 0.0, err)  # equal infinities
    pos = 0
    for i, n in enumerate(ct.lengths):
        reported = QuantCodec.payload_max_error(payload[pos : pos + n])
        pos += n
        seg = err[i * per : (i + 1) * per]
        if seg.numel() and not bool((seg <= reported).all()):
            return False
    return True


def run_case(x_dev, x_cpu, codec_kw: dict, bound: tuple | None, dry: bool) -> dict:
    """One case: compress on the device, on the CPU and with numba; compare; check bounds."""
    import tensorpress as tp
    from tensorpress.compress import compress_tensor, decompress_tensor
    from tensorpress.formats import tensor_to_stream

    kw = dict(codec_kw, chunk_bytes=IDENTITY_CHUNK_BYTES)
    if bound is not None:
        kw[bound[0]] = bound[1]
    bf16 = x_cpu.dtype == torch.bfloat16
    checks: dict[str, bool | None] = {
        "bytes gpu=cpu": None,
        "bytes cpu=numba": None,
        "values gpu=cpu": None,
        "values cpu=numba": None,
        "bound": None,
    }
    rec = {"checks": checks}
    try:
        ct_c = compress_tensor(x_cpu, **kw)
        rec["ratio"] = ct_c.ratio
        y_c = decompress_tensor(ct_c)
        outputs = [y_c]
        if not dry:
            ct_g = compress_tensor(x_dev, **kw)
            same = tuple(ct_g.lengths) == tuple(ct_c.lengths) and torch.equal(
                ct_g.payload.cpu(), ct_c.payload
            )
            if same:
                same = tensor_to_stream(ct_g) == tensor_to_stream(ct_c)
            checks["bytes gpu=cpu"] = same
            y_g = decompress_tensor(ct_g)
            assert y_g.device == x_dev.device, f"decoded on {y_g.device}"
            y_g = y_g.cpu()
            checks["values gpu=cpu"] = _same_values(y_g, y_c)
            outputs.append(y_g)
        x_np = x_cpu.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if bf16 else x_cpu.numpy()
        blob = tp.compress(x_np, **kw)
        checks["bytes cpu=numba"] = blob == tensor_to_stream(ct_c)
        y_n = np.ascontiguousarray(tp.decompress(blob))
        y_n = (
            torch.from_numpy(y_n.view(np.int16)).view(torch.bfloat16)
            if bf16
            else torch.from_numpy(y_n)
        )
        checks["values cpu=numba"] = _same_values(y_n, y_c)
        outputs.append(y_n)
        if bound is not None:
            rec["limit"] = ct_c.bound.tolerance
            checks["bound"] = all(
                within_bound(x_cpu, y, ct_c.bound.mode, ct_c.bound.tolerance) for y in outputs
            )
        else:
            checks["bound"] = all(within_reported(x_cpu, y, ct_c) for y in outputs)
        rec["max_err"] = max(_max_err(x_cpu, y) for y in outputs)
    except Exception as exc:  # noqa: BLE001 - count it, keep going
        rec["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    rec["ok"] = "error" not in rec and all(v is not False for v in checks.values())
    return rec


def _mark(v: bool | None) -> str:
    return "-" if v is None else ("ok" if v else "DIFF")


def _cases(have_quant: bool) -> list[tuple[str, dict, tuple | None]]:
    cases = [
        (f"block {mode}={value:g}", {"codec": "block"}, (mode, value))
        for mode, value in BLOCK_BOUNDS
    ]
    if have_quant:
        for bits, had, sto in QUANT_CONFIGS:
            params = {"codec": "quant", "bits": bits, "hadamard": had, "stochastic": sto}
            if sto:
                params["seed"] = QUANT_SEED
            label = f"quant {bits}b{' had' if had else ''}{' sto' if sto else ' near'}"
            cases.append((label, params, None))
    return cases


def identity_checks(arrays: dict, device, dry: bool, have_quant: bool) -> list[dict]:
    """Every array x dtype x case; prints one table per array."""
    records = []
    cases = _cases(have_quant)
    head = (
        f"{'case':<22} {'dtype':<8} {'ratio':>7} {'max err':>10} {'limit':>10} "
        f"{'B gpu=cpu':>9} {'B =numba':>8} {'V gpu=cpu':>9} {'V =numba':>8} {'bound':>5}  result"
    )
    for name, x in arrays.items():
        base = x if isinstance(x, torch.Tensor) else torch.from_numpy(x)
        base = base.to(device)
        print(f"\n== {name} {tuple(base.shape)} ({base.numel() * 4 / 2**20:.2f} MiB as float32) ==")
        print(head)
        for dtype in DTYPES:
            x_dev = base.to(dtype).contiguous()
            x_cpu = x_dev.cpu()
            for label, params, bound in cases:
                rec = run_case(x_dev, x_cpu, params, bound, dry)
                rec.update(array=name, case=label, dtype=str(dtype).removeprefix("torch."))
                records.append(rec)
                c = rec["checks"]
                limit = rec.get("limit")
                print(
                    f"{label:<22} {rec['dtype']:<8} {rec.get('ratio', math.nan):>7.2f} "
                    f"{rec.get('max_err', math.nan):>10.3g} "
                    f"{'reported' if bound is None else format(limit or math.nan, '.3g'):>10} "
                    f"{_mark(c['bytes gpu=cpu']):>9} {_mark(c['bytes cpu=numba']):>8} "
                    f"{_mark(c['values gpu=cpu']):>9} {_mark(c['values cpu=numba']):>8} "
                    f"{_mark(c['bound']):>5}  "
                    + ("PASS" if rec["ok"] else "FAIL " + rec.get("error", "")),
                    flush=True,
                )
    return records


# --------------------------------------------------------------------------- throughput


def _time_case(t: torch.Tensor, kw: dict, runs: int) -> dict:
    """Two warm-ups, peak CUDA memory of one compress, then ``runs`` timed runs of each."""
    from tensorpress.compress import compress_tensor, decompress_tensor

    cuda = t.device.type == "cuda"
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    nbytes = t.numel() * t.element_size()
    rec: dict = {}
    sync()
    t0 = time.perf_counter()
    for _ in range(2):
        decompress_tensor(compress_tensor(t, **kw))
        sync()
    warm = (time.perf_counter() - t0) / 2
    runs = runs if warm < SLOW_RUN_S else min(runs, 3)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        compress_tensor(t, **kw)
        sync()
        rec["peak_mem_x_input"] = torch.cuda.max_memory_allocated() / nbytes
    ctimes, dtimes = [], []
    ct = None
    for _ in range(runs):
        ct = None  # free the previous output before the next run
        sync()
        t0 = time.perf_counter()
        ct = compress_tensor(t, **kw)
        sync()
        ctimes.append(time.perf_counter() - t0)
    for _ in range(runs):
        sync()
        t0 = time.perf_counter()
        decompress_tensor(ct)
        sync()
        dtimes.append(time.perf_counter() - t0)
    rec.update(
        runs=runs,
        ratio=ct.ratio,
        compress_gbs=nbytes / 1e9 / statistics.median(ctimes),
        decompress_gbs=nbytes / 1e9 / statistics.median(dtimes),
    )
    return rec


def throughput(t: torch.Tensor, runs: int, have_quant: bool) -> list[dict]:
    """Median GB/s of compress_tensor / decompress_tensor on ``t`` for THROUGHPUT_CASES."""
    rows = []
    for label, kw in THROUGHPUT_CASES:
        if kw["codec"] == "quant" and not have_quant:
            continue
        rec: dict = {"case": label, "input_bytes": t.numel() * t.element_size()}
        try:
            rec.update(_time_case(t, kw, runs))
        except Exception as exc:  # noqa: BLE001 - report it, keep going
            rec["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        if t.device.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(rec)
        if "error" in rec:
            print(f"{label:<16} FAILED {rec['error']}", flush=True)
        else:
            peak = rec.get("peak_mem_x_input")
            print(
                f"{label:<16} {rec['ratio']:>7.2f} {rec['compress_gbs']:>9.3g} "
                f"{rec['decompress_gbs']:>8.3g} {'-' if peak is None else f'{peak:.2f}':>9} "
                f"{rec['runs']:>4}",
                flush=True,
            )
    return rows


def profile_calls(t: torch.Tensor, kw: dict, top: int = 12) -> dict:
    """Device time per kernel of one ``compress_tensor`` and one ``decompress_tensor`` of
    ``t`` (after a warm-up), printed; returns the totals (seconds)."""
    from tensorpress.compress import compress_tensor, decompress_tensor
    from torch.profiler import ProfilerActivity, profile

    decompress_tensor(compress_tensor(t, **kw))
    torch.cuda.synchronize()
    ct = compress_tensor(t, **kw)
    totals = {}
    for name, fn in (
        ("compress", lambda: compress_tensor(t, **kw)),
        ("decompress", lambda: decompress_tensor(ct)),
    ):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_name: dict[str, list] = {}
        for e in events:
            rec = by_name.setdefault(e.name, [0, 0.0])
            rec[0] += 1
            rec[1] += e.time_range.elapsed_us() / 1e6  # a kernel's own span
        busy = sum(v[1] for v in by_name.values())
        totals[name] = {"wall_s": wall, "kernels_s": busy, "kernels": len(events)}
        print(
            f"\n-- {name}: wall {wall * 1e3:.2f} ms, {len(events)} device events "
            f"{busy * 1e3:.2f} ms ({busy / wall:.0%} of wall)"
        )
        for kname, (cnt, sec) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"   {sec * 1e3:8.3f} ms {cnt:4d}x  {kname[:90]}")
    return totals


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Check compress_tensor on a CUDA GPU against the CPU and numba paths "
        "(identical bytes and values, bounds) and time it."
    )
    p.add_argument(
        "--corpus-dir",
        type=Path,
        default=DEFAULT_CORPUS_DIR,
        help="directory of corpus .npy files; missing files are skipped (default %(default)s)",
    )
    p.add_argument(
        "--size-mib",
        type=int,
        default=None,
        help="float32 MiB of the throughput tensor (default 1024; 4 with --cpu-dry-run)",
    )
    p.add_argument(
        "--max-mib",
        type=float,
        default=None,
        help="float32 MiB each identity array is cropped to (default 1; 0.25 with --cpu-dry-run)",
    )
    p.add_argument("--runs", type=int, default=10, help="timed runs per throughput case")
    p.add_argument("--json", metavar="OUT", default=None, help="write all results to OUT")
    p.add_argument(
        "--profile", action="store_true", help="device time per kernel of block rel 1e-2 calls"
    )
    p.add_argument(
        "--export-crops",
        metavar="DIR",
        type=Path,
        default=None,
        help="only write the cropped corpus arrays to DIR as .npy (small enough to carry to "
        "a GPU machine, then --corpus-dir DIR) and exit",
    )
    p.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="no CUDA: run the checks on the CPU on small arrays, numba vs torch-CPU only",
    )
    args = p.parse_args(argv)
    if args.size_mib is None:
        args.size_mib = 4 if args.cpu_dry_run else 1024
    if args.size_mib < 1:
        p.error("--size-mib must be >= 1")
    if args.runs < 1:
        p.error("--runs must be >= 1")
    if args.max_mib is None:
        args.max_mib = 0.25 if args.cpu_dry_run else 1.0
    if args.max_mib <= 0:
        p.error("--max-mib must be > 0")
    return args


def export_crops(args) -> int:
    """Write the corpus crops the identity checks use as .npy files (for a GPU machine
    that has no corpus of its own)."""
    crops = load_corpus_arrays(args.corpus_dir, int(args.max_mib * 2**20))
    args.export_crops.mkdir(parents=True, exist_ok=True)
    for name, x in crops.items():
        np.save(args.export_crops / f"{name}.npy", x)
    total = sum(x.nbytes for x in crops.values()) / 2**20
    print(f"wrote {len(crops)} crop(s), {total:.1f} MiB, to {args.export_crops}")
    return 0


def pick_device(dry: bool) -> torch.device | None:
    """The device to check (the CPU for a dry run); None when CUDA is missing."""
    if dry:
        print(f"device: cpu ({platform.processor() or platform.machine()}) -- CPU DRY RUN")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        print(
            "gpu_check needs a CUDA device and torch.cuda.is_available() is False; "
            "run with --cpu-dry-run to check the script on the CPU",
            file=sys.stderr,
        )
        return None
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}")
    return device


def run_throughput(args, device, dry: bool, have_quant: bool) -> tuple[list, dict | None]:
    """Throughput records of the large activation, and a profile if asked for."""
    print(f"\n== throughput: {args.size_mib} MiB float32 ReLU activation on {device} ==")
    print(f"{'case':<16} {'ratio':>7} {'comp GB/s':>9} {'dec GB/s':>8} {'peak mem':>9} {'runs':>4}")
    big = large_activation(device, args.size_mib)
    tput = throughput(big, args.runs, have_quant)
    prof = None
    if args.profile and not dry:
        try:
            prof = profile_calls(big, THROUGHPUT_CASES[0][1])
        except Exception as exc:  # noqa: BLE001 - a profiler problem is no check failure
            print(f"profile failed: {type(exc).__name__}: {exc}")
    return tput, prof


def print_verdict(records: list, tput: list, device, elapsed: float) -> tuple[str, dict]:
    """Print the failed cases and the verdict line; the verdict and the counts."""
    failed = [r for r in records if not r["ok"]]
    identity_failed = [
        r for r in failed if any(v is False for k, v in r["checks"].items() if k != "bound")
    ]
    if failed:
        print(f"\n!! {len(failed)} failed case(s):")
        for r in failed:
            bad = [k for k, v in r["checks"].items() if v is False]
            print(
                f"!!   {r['array']} {r['dtype']} {r['case']}: "
                + ", ".join(bad + ([r["error"]] if "error" in r else []))
            )
    speeds = "; ".join(
        f"{r['case']} {r['compress_gbs']:.3g}/{r['decompress_gbs']:.3g} GB/s x{r['ratio']:.2f}"
        if "error" not in r
        else f"{r['case']} FAILED"
        for r in tput
    )
    verdict = "FAIL" if failed or any("error" in r for r in tput) else "PASS"
    print(
        f"\n{verdict}: {len(records) - len(failed)} passed, {len(failed)} failed "
        f"({len(identity_failed)} identity) of {len(records)} cases on {device}; "
        f"comp/dec {speeds}; {elapsed:.0f} s"
    )
    return verdict, {
        "passed": len(records) - len(failed),
        "failed": len(failed),
        "identity_failed": len(identity_failed),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.export_crops is not None:
        return export_crops(args)
    import tensorpress as tp

    started = time.perf_counter()
    dry = args.cpu_dry_run
    print(f"torch {torch.__version__}, tensorpress {tp.__version__}, numpy {np.__version__}")
    device = pick_device(dry)
    if device is None:
        return 2
    have_quant = "quant" in tp.available_codecs()
    if not have_quant:
        print("note: tensorpress has no 'quant' codec: quant cases skipped")
    max_bytes = int(args.max_mib * 2**20)
    corpus = load_corpus_arrays(args.corpus_dir, max_bytes)
    print(
        f"corpus {args.corpus_dir}: {len(corpus)} array(s) used"
        + (f": {', '.join(corpus)}" if corpus else "")
    )
    arrays = {**corpus, **synthetic_arrays(device, max_bytes)}
    mode = "numba vs torch-CPU" if dry else "torch-GPU vs torch-CPU vs numba"
    print(
        f"identity: {len(arrays)} arrays x {len(DTYPES)} dtypes x "
        f"{len(_cases(have_quant))} cases, {mode}; chunk_bytes {IDENTITY_CHUNK_BYTES}"
    )
    records = identity_checks(arrays, device, dry, have_quant)
    del arrays
    tput, prof = run_throughput(args, device, dry, have_quant)
    elapsed = time.perf_counter() - started
    verdict, counts = print_verdict(records, tput, device, elapsed)
    if args.json:
        meta = {
            "torch": torch.__version__,
            "tensorpress": tp.__version__,
            "device": "cpu (dry run)" if dry else torch.cuda.get_device_name(device),
            "corpus_arrays": list(corpus),
            "max_mib": args.max_mib,
            "size_mib": args.size_mib,
            "seconds": elapsed,
        }
        payload = {"meta": meta, "cases": records, "throughput": tput, "profile": prof, **counts}
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=1, default=str)
        print(f"results written to {args.json}")
    return 1 if verdict == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())
