"""Per-call latency of ``compress_tensor`` / ``decompress_tensor`` by tensor size.

Inside a training step every saved tensor is one call, so for small and middle-sized
tensors the fixed cost per call (host syncs, kernel launches, Python) matters more
than GB/s. For float32 tensors of ``--sizes`` KiB on ``--device`` (default cuda when
there is one), first the device codes (``compress_codes`` / ``restore_codes``, rel 1e-2
and 1e-3): the median wall time of ``--runs`` synchronised calls after two warm-ups,
and the host time of a call (``--runs`` calls queued back to back, no synchronisation
between them, per call): what a training step pays on the CPU side while the GPU
works; then their fixed cost per call (the wall time at the smallest size) and host
time per call at rel 1e-2, against the targets of 50 and 30 us. Then the container
path, ``compress_tensor`` / ``decompress_tensor``: the same wall times for block
(rel 1e-2, abs 1e-2) and quant (2 bits), beside what a plain copy of the tensor costs.
Then a GELU output held as its residual (``activation_offload/device/gelu.py``, rel
1e-2 of a GELU's float32 output against its input held under rel 1e-2): the torch ops a
call dispatches, counted on meta tensors (no data, so the host's whole cost per call),
and on CUDA the kernels it launches (profiler), beside the same wall and host times per
call, for the custom ops (Triton kernels on CUDA) and for the torch reference's chain of
ops they replace. Then what the custom ops' dispatch costs: host time per call of
``tensorpress::device_blocks`` and of its body called directly (what eager CUDA calls
run, ``activation_offload/device/ops.eager``) on a 64-element tensor. ``--profile`` adds
cProfile's top functions (by own time) over the calls on the middle size, to show where
the fixed cost goes.

    python benchmarks/tensor_latency.py [--device cuda] [--sizes 64 1024 16384] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from tensorpress.activation_offload.device import gelu_torch as device_gelu_torch
from tensorpress.activation_offload.device import ops as device_ops
from tensorpress.activation_offload.device.codes import compress_codes, restore_codes
from tensorpress.activation_offload.device.gelu import pack_output, unpack_output
from tensorpress.activation_offload.device.tiles import compress_blocks, restore_blocks
from tensorpress.compress import compress_tensor, decompress_tensor
from torch.utils._python_dispatch import TorchDispatchMode

FIXED_COST_US = 50  # target: the device codes' cost per call, whatever the size
HOST_TIME_US = 30  # target: host time per call, what a step pays while the GPU works
CASES = (
    ("block rel=1e-2", {"codec": "block", "rel": 1e-2}),
    ("block abs=1e-2", {"codec": "block", "abs": 1e-2}),
    ("quant bits=2", {"codec": "quant", "bits": 2}),
)


def _timed(fn, device: torch.device, runs: int) -> float:
    """Median seconds of ``runs`` calls of ``fn`` (each synchronised) after 2 warm-ups."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for i in range(runs + 2):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _host_time(fn, device: torch.device, runs: int) -> float:
    """Seconds of host time per call of ``fn``: ``runs`` calls queued without waiting."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(runs):
        fn()
    host = (time.perf_counter() - t0) / runs
    if device.type == "cuda":
        torch.cuda.synchronize()
    return host


def device_codes_rows(sizes, dev: torch.device, runs: int, g: torch.Generator) -> dict:
    """The device codes' wall and host times per call (see the module docstring), printed
    and returned as {(rel, KiB): (compress, restore, host compress, host restore) s}."""
    found = {}
    print(
        f"{'device codes':16} {'KiB':>7} {'compress':>10} {'decompress':>11} "
        f"{'host c':>7} {'host d':>7} {'ratio':>6}"
    )
    for kib in sizes:
        x = torch.relu(torch.randn(kib * 256, device=dev, generator=g))
        for rel in (1e-2, 1e-3):
            codes = compress_codes(x, rel)
            comp = _timed(lambda x=x, rel=rel: compress_codes(x, rel), dev, runs)
            dec = _timed(lambda c=codes: restore_codes(c), dev, runs)
            host_c = _host_time(lambda x=x, rel=rel: compress_codes(x, rel), dev, runs)
            host_d = _host_time(lambda c=codes: restore_codes(c), dev, runs)
            ratio = x.numel() * 4 / codes.nbytes
            found[rel, kib] = (comp, dec, host_c, host_d)
            print(
                f"{f'rel={rel:g}':16} {kib:>7} {comp * 1e6:>10.0f} {dec * 1e6:>11.0f} "
                f"{host_c * 1e6:>7.0f} {host_d * 1e6:>7.0f} {ratio:>6.2f}"
            )
    return found


def print_fixed_cost(found: dict, rel: float = 1e-2) -> None:
    """The device codes' fixed cost per call: the wall time at the smallest size (its
    bytes take a fraction of a microsecond on a GPU), against its targets."""
    kib = min(k for r, k in found if r == rel)
    comp, dec, host_c, host_d = found[rel, kib]

    def verdict(seconds: float, target_us: float) -> str:
        return f"{seconds * 1e6:.0f} us ({'MET' if seconds * 1e6 <= target_us else 'NOT MET'})"

    print(
        f"\nfixed cost per call, device codes rel={rel:g} (wall time at {kib} KiB; target "
        f"<= {FIXED_COST_US} us): compress {verdict(comp, FIXED_COST_US)}, restore "
        f"{verdict(dec, FIXED_COST_US)}"
    )
    print(
        f"host time per call (target <= {HOST_TIME_US} us): compress "
        f"{verdict(host_c, HOST_TIME_US)}, restore {verdict(host_d, HOST_TIME_US)}",
        flush=True,
    )


class _OpCount(TorchDispatchMode):
    """Counts the torch ops dispatched inside it (a custom op is one: its own kernels
    run below the dispatcher)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _gelu_calls(numel: int, dev: torch.device, g=None) -> dict:
    """{(path, "pack" | "restore"): call} for a GELU's float32 output of ``numel``
    elements: the custom ops (``pack_output`` / ``unpack_output``), and the torch
    reference's chain of ops (what the ops run without Triton)."""
    if dev.type == "meta":
        x = torch.empty(numel, device=dev)
    else:
        x = torch.randn(numel, device=dev, generator=g) * 2
    y = F.gelu(x)
    src, _ = compress_blocks(x, 1e-2)
    xr = restore_blocks(src, x.shape, x.dtype)
    settings = (1e-2, False, None, 0.0)
    scalars, record, _ = pack_output(y, src, x.shape, "none", 1e-2, None, settings)
    ref = device_gelu_torch
    return {
        ("ops", "pack"): lambda: pack_output(y, src, x.shape, "none", 1e-2, None, settings),
        ("ops", "restore"): lambda: unpack_output(xr, record, "none", scalars, y.shape, y.dtype),
        ("reference", "pack"): lambda: ref.pack(y, src, "none", *settings),
        ("reference", "restore"): lambda: ref.restore(
            xr, record, scalars, "none", y.shape, y.dtype
        ),
    }


def _kernels_launched(fn) -> int:
    """Device activities (kernels, memsets, copies) one call of ``fn`` starts on CUDA,
    from the profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


def gelu_rows(sizes, dev: torch.device, runs: int, g: torch.Generator) -> None:
    """The GELU residual's ops per call and times per call (see the module docstring)."""
    meta = _gelu_calls(sizes[0] * 256, torch.device("meta"))
    print(f"\n{'GELU residual':22} {'torch ops':>9} {'host us (meta)':>15}")
    for (path, step), fn in meta.items():
        with _OpCount() as count:
            fn()
        host = statistics.median(_host_time(fn, torch.device("meta"), runs) for _ in range(5))
        print(f"{path + ' ' + step:22} {count.ops:>9} {host * 1e6:>15.1f}", flush=True)
    cuda = dev.type == "cuda"
    print(
        f"\n{'GELU residual':22} {'KiB':>7} {'wall us':>9} {'host us':>9}"
        + (f" {'kernels':>8}" if cuda else "")
    )
    for kib in sizes:
        for (path, step), fn in _gelu_calls(kib * 256, dev, g).items():
            wall = _timed(fn, dev, runs)
            host = _host_time(fn, dev, runs)
            launches = f" {_kernels_launched(fn):>8}" if cuda else ""
            print(
                f"{path + ' ' + step:22} {kib:>7} {wall * 1e6:>9.0f} {host * 1e6:>9.0f}{launches}",
                flush=True,
            )


def dispatch_rows(dev: torch.device, runs: int) -> None:
    """Host time per call of a custom op and of its body on a 64-element tensor, in
    alternating rounds (the difference paired round by round: what the dispatch costs)."""
    x = torch.linspace(-1, 1, 64, device=dev)
    op = lambda: device_ops.device_blocks(x, 1e-2, 256)  # noqa: E731
    body = lambda: device_ops.rel_blocks(x, 1e-2, 256)  # noqa: E731
    rounds = [(_host_time(op, dev, runs * 20), _host_time(body, dev, runs * 20)) for _ in range(9)]
    print(f"\n{'custom-op dispatch':22} {'host us':>9}")
    for name, values in (
        ("op device_blocks", [a for a, _ in rounds]),
        ("its body", [b for _, b in rounds]),
        ("dispatch (paired)", [a - b for a, b in rounds]),
    ):
        print(f"{name:22} {statistics.median(values) * 1e6:>9.1f}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 1024, 16384], help="KiB")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    g = torch.Generator(device=dev).manual_seed(0)
    print(f"torch {torch.__version__}, device {dev}; median of {args.runs} calls, microseconds")
    # the device codes first: their fixed cost is what a short GPU run must not miss
    print_fixed_cost(device_codes_rows(args.sizes, dev, args.runs, g))
    gelu_rows(args.sizes, dev, args.runs, g)
    dispatch_rows(dev, args.runs)
    print(
        f"\n{'case':16} {'KiB':>7} {'copy':>9} {'compress':>10} {'decompress':>11} {'ratio':>6}",
        flush=True,
    )
    for kib in args.sizes:
        x = torch.relu(torch.randn(kib * 256, device=dev, generator=g))
        copy = _timed(lambda x=x: x.clone(), dev, args.runs)
        for name, kw in CASES:
            ct = compress_tensor(x, **kw)
            comp = _timed(lambda x=x, kw=kw: compress_tensor(x, **kw), dev, args.runs)
            dec = _timed(lambda ct=ct: decompress_tensor(ct), dev, args.runs)
            print(
                f"{name:16} {kib:>7} {copy * 1e6:>9.0f} {comp * 1e6:>10.0f} {dec * 1e6:>11.0f} "
                f"{ct.ratio:>6.2f}",
                flush=True,
            )
    if args.profile:
        kib = sorted(args.sizes)[len(args.sizes) // 2]
        x = torch.relu(torch.randn(kib * 256, device=dev, generator=g))
        for name, kw in CASES[:1] + CASES[2:]:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.runs):
                decompress_tensor(compress_tensor(x, **kw))
            if dev.type == "cuda":
                torch.cuda.synchronize()
            prof.disable()
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
            print(f"\n== cProfile: {args.runs} x compress+decompress, {name}, {kib} KiB ==")
            print(out.getvalue()[-6000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
