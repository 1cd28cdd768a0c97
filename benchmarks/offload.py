"""Offload benchmark: the store's NVMe tier against the raw disk, and training with
saved activations that do not fit in the store's host budget.

Part 1, ``disk``: sustained write and read bandwidth (GB = 1e9 bytes) of ``--disk-mib``
MiB, in the same run and on the same directory (``--nvme-dir``):

  raw O_DIRECT loop      ``os.pwritev`` of an 8 MiB ``aligned_buffer`` (page-aligned,
                         in huge pages where the kernel grants them, as the store's
                         own buffers) to a file opened with ``O_DIRECT``, ``fsync`` at
                         the end; then ``preadv`` back with ``O_DIRECT``. Every ratio is
                         against this row.
  raw loop, 4 KiB pages  the same loop with a buffer in plain pages (``MADV_NOHUGEPAGE``),
                         as most programs have: how much the buffer's pages matter
  dd direct              ``dd if=/dev/zero of=F bs=8M count=N oflag=direct`` and
                         ``dd if=F of=/dev/null bs=8M iflag=direct`` (dd's own timing,
                         no fsync; n/a without dd)
  SpillDir 1/2 threads   ``SpillDir.write`` of 16 MiB records from ``aligned_buffer``s
                         (zero copy), from 1 or 2 threads, the slab files fsynced at the
                         end; ``SpillDir.read_record`` back from as many threads,
                         each record whole into one ``aligned_buffer`` (each record's
                         XXH3-64 is computed on write and checked on read)
  TieredStore put / get  ``TieredStore(cpu_bytes=0, nvme_dir=...)``: put N float32
                         tensors of 16 MiB, wait for all, fsync (write); then ``get``
                         all in order from the calling thread (each get in order reads
                         the next record ahead), each record whole in one read into a
                         buffer of the store's ``IO_BUFFERS`` (read)
  TieredStore prefetch   the same records: ``prefetch`` all, then ``get`` all (read)

In both, the store's reader thread reads the records one after another while the
thread that asked for each (a worker, or the caller) checks its digest.

Each measurement is repeated 3 times (the median is printed); files are deleted
between measurements and nothing is dropped from the page cache (O_DIRECT bypasses
it; whether the SpillDir uses it, ``sd.direct``, is printed). The disk's speed moves
from minute to minute here, so the raw loop also runs between the other rows, and
each row's "x raw" is the median over the repeats of its speed over the mean of the
raw loops just before and just after it. Each read row is also timed against the raw
loop's reads (8 MiB, one in flight) of the row's own files, just before and just
after it ("x same blocks"). On the virtio disk here the speed of an O_DIRECT transfer
follows the pages of the memory it goes to or from: a buffer of scattered 4 KiB pages
read at 1.3 GB/s, one whose pages lay in runs of 32 KiB at 3.1, one in 2 MiB huge pages
at 4.2, on the same file in the same minute. Target: every ``TieredStore`` row (the
store a user runs: put and prefetch through its workers) >= 0.8x the raw loop, writes
against the raw loops beside them and reads against the same blocks; the ``SpillDir``
rows show its file tier alone, one or two calling threads and no helpers, for
diagnosis.

Part 2, ``train``: a residual GELU MLP (width 256, 5 blocks of Linear -> GELU, plus
a residual add; fp32, batch 16384, synthetic data with a fixed seed, labels from a
fixed random teacher) whose saved activations are ~177 MiB per step (~33 MiB with
``--quick``, batch 3072), trained with SGD (lr 0.05, momentum 0.9) from the same
initial weights for 8 steps (5 with ``--quick``) per variant and round; the variants
take turns, in 3 rounds (2 with ``--quick``), so that noise from other processes
spreads over all of them (an untimed plain warm-up run goes first):

  (a) plain           autograd keeps the saved tensors
  (b) save_on_cpu     ``torch.autograd.graph.save_on_cpu`` (pin_memory only on CUDA)
  (c) store cpu       ``offload_activations(store)``, ``TieredStore(cpu_bytes)`` large
                      enough for everything, no file tier
  (d) store nvme      ``cpu_bytes`` = (a)'s activation bytes / ``--cpu-fraction``
                      (default 16), ``nvme_dir``: the rest spills to files;
                      ``max_pending_bytes`` = ``cpu_bytes`` / 2 (puts wait rather
                      than keep more tensors alive until they are stored)
  (e) store nvme+blk  (d) under ``ActivationCompression("block", rel=1e-2, offload=store)``

Columns: median step time (the steps after 2 warm-ups, of all rounds) and its ratio to
(a); peak bytes held in process memory for activations (a: the bytes autograd saves in
one step, counted by a ``saved_tensors_hooks`` pass over the first batch, unique tensors
that are not parameters; b: the same bytes, on the host; store variants: the max over
steps of ``ac.stats.peak_device_bytes + store.stats.peak_cpu_bytes +
store.stats.host_bytes + store.stats.peak_pending_bytes``, the last being tensors put
and not yet copied, still in memory) and its ratio to (a)'s; MiB written to and read
from files per step; the fraction of gets served by a prefetch;
``store.stats.pending_bytes`` when a forward ends (max over steps); the process's RSS
high-water mark over the variant less its RSS at the start (``/proc/self/clear_refs``
after ``malloc_trim``; all the process touched: activations, the store's in-flight
copies and staging buffers, the free ones ``IO_BUFFERS`` keeps, the allocator's
slack); the final loss and whether the per-step losses, the last step's gradients and
the final weights are bit-identical to (a); on CUDA the largest
``torch.cuda.memory_allocated`` right after a forward and
``torch.cuda.max_memory_allocated`` over the steps, both less what was allocated before
the variant started (after ``gc.collect``, ``empty_cache`` and
``reset_peak_memory_stats``). Target: (e) holds <= 1/10 of (a)'s activation bytes at a
step time <= 1.5x (a)'s. Every store is closed after its variant; at the end the nvme
directory must hold no ``tensorpress-spill-*`` directory (exit status 1 if it does).

    python benchmarks/offload.py                  # full run, about 3 min on 2 cores
    python benchmarks/offload.py --quick          # smoke run, under a minute
    python benchmarks/offload.py --only disk --disk-mib 4096
    python benchmarks/offload.py --markdown       # tables for RESULTS.md
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import mmap
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from compressors import Table
    from compressors import fmt_cell as _fmt
    from compressors import ratio_or_none as _ratio
except ImportError:  # imported as benchmarks.offload
    from benchmarks.compressors import Table
    from benchmarks.compressors import fmt_cell as _fmt
    from benchmarks.compressors import ratio_or_none as _ratio

from tensorpress.activation_offload import (
    ActivationCompression,
    TieredStore,
    offload_activations,
)
from tensorpress.activation_offload.store.spill import ALIGN, PREFIX, SpillDir, aligned_buffer

SEED = 0
MIB = 2**20
GB = 1e9
DEFAULT_NVME_DIR = Path(__file__).resolve().parent / ".cache" / "offload"
DEFAULT_DISK_MIB, QUICK_DISK_MIB = 1024, 256
RAW_CHUNK = 8 * MIB  # raw loop and dd block size
RECORD = 16 * MIB  # SpillDir records and TieredStore tensors
REPEAT = 3
TARGET_DISK_X = 0.8
# training
WIDTH, BLOCKS, CLASSES = 256, 5, 10
BATCH, QUICK_BATCH = 16384, 3072
STEPS, QUICK_STEPS, WARMUP = 8, 5, 2  # per round
ROUNDS, QUICK_ROUNDS = 3, 2  # every variant trains this many times, in turn
N_BATCHES = 4  # distinct synthetic batches, cycled
LR = 0.05
REL = 1e-2
MIN_BYTES = 1 << 16
DEFAULT_CPU_FRACTION = 16
TARGET_HELD_FRACTION = 0.1
TARGET_TIME_X = 1.5


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


# =========================================================================== disk


def _fill(buf: memoryview, seed: int) -> None:
    """Random bytes (not zeros: nothing on the way can shortcut them)."""
    rng = np.random.default_rng(seed)
    np.frombuffer(buf, dtype=np.uint8)[:] = rng.integers(0, 256, len(buf), dtype=np.uint8)


def _fsync_dir_files(path: Path) -> None:
    """fsync every regular file under ``path`` (the slab files of a SpillDir)."""
    for p in _slab_files(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def plain_pages(nbytes: int) -> memoryview:
    """A page-aligned buffer in plain 4 KiB pages (no huge pages), placed wherever the
    kernel puts them, as most programs' buffers are."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)
    return memoryview(m)


def raw_loop(path: Path, total: int, buf: memoryview) -> tuple[float, float]:
    """(write s, read s) of ``total`` bytes with O_DIRECT pwritev/preadv of ``buf``."""
    n = total // len(buf)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT
    t0 = time.perf_counter()
    fd = os.open(path, flags, 0o600)
    try:
        for i in range(n):
            off = i * len(buf)
            done = 0
            while done < len(buf):
                done += os.pwritev(fd, [buf[done:]], off + done)
        os.fsync(fd)
    finally:
        os.close(fd)
    t_write = time.perf_counter() - t0
    t_read = n * len(buf) / raw_read_files([path], buf)
    path.unlink()
    return t_write, t_read


_DD_RE = re.compile(r"(\d+) bytes .*copied, ([0-9.]+) s")


def raw_read_files(paths: Sequence[Path], buf: memoryview) -> float:
    """Bytes per second of reading ``paths`` whole with the raw loop's reads (O_DIRECT
    ``preadv`` of ``buf``, one in flight): the raw disk on the very blocks a row read."""
    total, t0 = 0, time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            size = os.fstat(fd).st_size
            for off in range(0, size, len(buf)):
                want = min(len(buf), size - off)
                if os.preadv(fd, [buf[:want]], off) != want:
                    raise OSError(f"short read in the raw loop over {path}")
                total += want
        finally:
            os.close(fd)
    return total / (time.perf_counter() - t0)


def _slab_files(path: Path) -> list[Path]:
    return sorted(path.glob("slab_*.bin"))


def _dd_seconds(args: list[str]) -> float:
    out = subprocess.run(
        args, capture_output=True, text=True, check=True, env={**os.environ, "LC_ALL": "C"}
    )
    m = _DD_RE.search(out.stderr)
    if m is None:
        raise RuntimeError(f"cannot parse dd output: {out.stderr.strip()!r}")
    return float(m.group(2))


def dd_run(path: Path, total: int) -> tuple[float, float]:
    count = total // RAW_CHUNK
    t_write = _dd_seconds(
        ["dd", "if=/dev/zero", f"of={path}", "bs=8M", f"count={count}", "oflag=direct"]
    )
    t_read = _dd_seconds(["dd", f"if={path}", "of=/dev/null", "bs=8M", "iflag=direct"])
    path.unlink()
    return t_write, t_read


def spilldir_run(parent: Path, total: int, bufs: list[memoryview], threads: int, raw_buf):
    """(write s, read s, direct, raw GB/s over its files) of ``total`` bytes in
    RECORD-byte records."""
    n = total // RECORD
    with SpillDir(parent) as sd:
        direct = sd.direct
        shares = [list(range(i, n, threads)) for i in range(threads)]
        locs: list = [None] * n

        def write(k: int) -> None:
            for i in shares[k]:
                locs[i] = sd.write(bufs[k])

        def read(k: int) -> None:
            for i in shares[k]:
                sd.read_record(locs[i], outs[k])

        with ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            list(pool.map(write, range(threads)))
            _fsync_dir_files(sd.path)
            t_write = time.perf_counter() - t0
            outs = [aligned_buffer(sd.record_bytes(locs[0])) for _ in range(threads)]
            for out in outs:  # pages in place before the clock starts, as the raw loop's
                out[::ALIGN] = bytes(len(out[::ALIGN]))
            same = raw_read_files(_slab_files(sd.path), raw_buf)
            t0 = time.perf_counter()
            list(pool.map(read, range(threads)))
            t_read = time.perf_counter() - t0
            same = (same + raw_read_files(_slab_files(sd.path), raw_buf)) / 2
    return t_write, t_read, direct, same / GB


def store_run(parent: Path, total: int, tensor: torch.Tensor, raw_buf) -> tuple[float, ...]:
    """(put+wait s, get s, prefetch+get s, raw GB/s over its files before and after the
    gets, the same between the gets and the prefetches and after those) of ``total``
    bytes of RECORD-byte tensors."""
    n = total // RECORD
    store = TieredStore(cpu_bytes=0, nvme_dir=parent)
    try:
        t0 = time.perf_counter()
        handles = [store.put(tensor) for _ in range(n)]
        for h in handles:
            store.wait(h)
        _fsync_dir_files(store.spill.path)
        t_write = time.perf_counter() - t0
        if store.stats.spilled_bytes != n * RECORD:
            raise RuntimeError(f"the store spilled {store.stats.spilled_bytes} bytes, not all")
        files = _slab_files(store.spill.path)
        same = [raw_read_files(files, raw_buf)]
        t0 = time.perf_counter()
        for h in handles:
            store.get(h)
        t_get = time.perf_counter() - t0
        same.append(raw_read_files(files, raw_buf))
        t0 = time.perf_counter()
        for h in handles:
            store.prefetch(h)
        for h in handles:
            store.get(h)
        t_prefetch = time.perf_counter() - t0
        same.append(raw_read_files(files, raw_buf))
        check = store.get(handles[-1])
        if not torch.equal(check, tensor):
            raise RuntimeError("the store read back different bytes")
    finally:
        store.close()
    same_get, same_pre = (same[0] + same[1]) / 2 / GB, (same[1] + same[2]) / 2 / GB
    return t_write, t_get, t_prefetch, same_get, same_pre


@dataclass
class DiskRow:
    name: str
    write: list[float] = field(default_factory=list)  # GB/s per repeat
    read: list[float] = field(default_factory=list)
    write_x: list[float] = field(default_factory=list)  # over the raw loops beside it
    read_x: list[float] = field(default_factory=list)
    same_x: list[float] = field(default_factory=list)  # over the raw loop on its own files
    note: str = ""


def run_disk(args: argparse.Namespace, markdown: bool) -> None:
    parent = args.nvme_dir
    total = args.disk_mib * MIB
    total -= total % RECORD
    if total <= 0:
        raise SystemExit(f"--disk-mib must be at least {RECORD // MIB}")
    raw_buf = aligned_buffer(RAW_CHUNK)
    _fill(raw_buf, 1)
    plain_buf = plain_pages(RAW_CHUNK)
    _fill(plain_buf, 1)
    rec_bufs = [aligned_buffer(RECORD) for _ in range(2)]
    for k, b in enumerate(rec_bufs):
        _fill(b, 2 + k)
    g = torch.Generator().manual_seed(SEED)
    tensor = torch.randn(RECORD // 4, generator=g)
    have_dd = shutil.which("dd") is not None
    rows = {
        "raw": DiskRow("raw O_DIRECT loop (8 MiB)", note="pwritev/preadv, fsync"),
        "plain": DiskRow("raw loop, 4 KiB pages", note="its buffer not in huge pages"),
        "dd": DiskRow("dd direct (bs=8M)", note="no fsync" if have_dd else "dd not found"),
        "sd1": DiskRow("SpillDir 1 thread (16 MiB)"),
        "sd2": DiskRow("SpillDir 2 threads (16 MiB)"),
        "put": DiskRow("TieredStore put / get", note="cpu_bytes=0, 2 workers"),
        "pre": DiskRow("TieredStore prefetch+get", note="read only"),
    }
    direct = None
    file = parent / "offload-bench-raw.bin"

    def raw() -> tuple[float, float]:
        w, r = raw_loop(file, total, raw_buf)
        rows["raw"].write.append(total / w / GB)
        rows["raw"].read.append(total / r / GB)
        return rows["raw"].write[-1], rows["raw"].read[-1]

    def plain() -> dict:
        w, r = raw_loop(file, total, plain_buf)
        return {"plain": (total / w / GB, total / r / GB, None)}

    def dd() -> dict:
        nonlocal have_dd
        if not have_dd:
            return {}
        try:
            w, r = dd_run(file, total)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            rows["dd"].note = f"dd failed: {exc}"
            have_dd = False
            file.unlink(missing_ok=True)
            return {}
        return {"dd": (total / w / GB, total / r / GB, None)}

    def spilldir(key: str, threads: int) -> dict:
        nonlocal direct
        w, r, direct, same = spilldir_run(parent, total, rec_bufs, threads, raw_buf)
        return {key: (total / w / GB, total / r / GB, same)}

    def store() -> dict:
        w, r, p, same_r, same_p = store_run(parent, total, tensor, raw_buf)
        return {
            "put": (total / w / GB, total / r / GB, same_r),
            "pre": (None, total / p / GB, same_p),
        }

    measures = (plain, dd, lambda: spilldir("sd1", 1), lambda: spilldir("sd2", 2), store)
    for rep in range(REPEAT):
        before = raw()
        for measure in measures:
            got = measure()
            if not got:
                continue
            after = raw()
            ref_w, ref_r = ((a + b) / 2 for a, b in zip(before, after, strict=True))
            for key, (w, r, same) in got.items():
                if w is not None:
                    rows[key].write.append(w)
                    rows[key].write_x.append(w / ref_w)
                rows[key].read.append(r)
                rows[key].read_x.append(r / ref_r)
                if same is not None:
                    rows[key].same_x.append(r / same)
            before = after
        print(f"  (disk repeat {rep + 1}/{REPEAT} done)", file=sys.stderr, flush=True)
    for key in ("sd1", "sd2"):
        rows[key].note = f"sd.direct={direct}, XXH3-64 on write and read"

    table = Table(
        f"disk: {total // MIB} MiB to {parent}, median of {REPEAT} (GB = 1e9 bytes; "
        "x raw: against the raw loops run just before and after; x same blocks: against "
        "the raw loop reading the row's own files just before and after)",
        [
            ("path", 27, "<"),
            ("write GB/s", 10, ">"),
            ("write x raw", 11, ">"),
            ("read GB/s", 9, ">"),
            ("read x raw", 10, ">"),
            ("read x same blocks", 18, ">"),
            ("note", 4, "<"),
        ],
        markdown,
    )
    table.header()
    for key, row in rows.items():
        w = _median(row.write) if row.write else None
        r = _median(row.read) if row.read else None
        wx = 1.0 if key == "raw" else _median(row.write_x) if row.write_x else None
        rx = 1.0 if key == "raw" else _median(row.read_x) if row.read_x else None
        sx = 1.0 if key == "raw" else _median(row.same_x) if row.same_x else None
        table.row(
            row.name,
            _fmt(w, ".3f", na="n/a"),
            _fmt(wx, ".2f", "x", na="n/a"),
            _fmt(r, ".3f", na="n/a"),
            _fmt(rx, ".2f", "x", na="n/a"),
            _fmt(sx, ".2f", "x", na="n/a"),
            row.note,
        )
    print()
    print(f"SpillDir uses O_DIRECT: sd.direct = {direct}")
    checks = []
    for key in ("put", "pre"):
        row = rows[key]
        for what, ratios in (("write", row.write_x), ("read", row.same_x)):
            if ratios:
                x = _median(ratios)
                checks.append((x >= TARGET_DISK_X, f"{row.name} {what} {x:.2f}x"))
    met = all(ok for ok, _ in checks)
    missed = [what for ok, what in checks if not ok]
    print(
        f"disk target (TieredStore rows >= {TARGET_DISK_X}x the raw O_DIRECT loop: writes "
        "x raw, reads x same blocks): " + ("MET" if met else "NOT MET (" + "; ".join(missed) + ")")
    )


# =========================================================================== train


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.fc(x))


class MLP(nn.Module):
    """Residual GELU MLP: each block saves its input (Linear) and pre-activation (GELU)."""

    def __init__(self, width: int = WIDTH, blocks: int = BLOCKS, classes: int = CLASSES):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(blocks)))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def make_batches(batch: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(SEED + 1)
    teacher = torch.randn(WIDTH, CLASSES, generator=g)
    out = []
    for _ in range(N_BATCHES):
        x = torch.randn(batch, WIDTH, generator=g)
        y = (x @ teacher).argmax(1)
        out.append((x.to(device), y.to(device)))
    return out


def count_activation_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes autograd saves in one forward: unique tensors that are not parameters."""
    own = {t.untyped_storage().data_ptr() for t in model.parameters()}
    seen: dict = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            key = (ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
            seen[key] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(model(x), y)
    return sum(seen.values())


@dataclass
class TrainResult:
    variant: str
    step_s: float | None = None
    held: int | None = None  # peak bytes held in process memory for activations
    written: float | None = None  # file bytes per step
    read: float | None = None
    prefetched: float | None = None  # fraction of gets
    loss: float | None = None
    losses: list[float] = field(default_factory=list)
    state: dict | None = None  # final weights and last gradients (CPU copies)
    cuda_fwd: int | None = None
    cuda_max: int | None = None
    rss: int | None = None  # VmHWM over the variant less VmRSS at its start
    unstored: int | None = None  # bytes put in a forward, not yet stored at its end
    stored: int | None = None  # ac.stats.stored_bytes of the last step
    note: str = ""
    times: list[float] = field(default_factory=list)  # timed steps of all rounds
    gets: int = 0
    prefetched_gets: int = 0
    steps_run: int = 0
    failed: bool = False


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None) if sys.platform == "linux" else None


def _rss_reset() -> int | None:
    """Return freed heap to the OS, reset the process's RSS high-water mark
    (``/proc/self/clear_refs``) and return the RSS now; None where that is impossible."""
    gc.collect()
    with contextlib.suppress(AttributeError, OSError):
        if _LIBC is not None:
            _LIBC.malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _proc_status("VmRSS")
    except OSError:
        return None


def _proc_status(key: str) -> int | None:
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def train_variant(
    res: TrainResult,
    make_context: Callable[[], tuple[Callable[[], object], object, TieredStore | None]],
    batches: list,
    steps: int,
    device: torch.device,
) -> None:
    """One round: train a fresh model (seed ``SEED``) for ``steps`` steps; merge the
    measurements into ``res`` (times pooled, peaks maxed, the first round's losses)."""
    torch.manual_seed(SEED)
    model = MLP().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    rss0 = _rss_reset()
    context, ac, store = make_context()
    losses, held, host_peak = [], 0, 0
    try:
        for i in range(steps):
            x, y = batches[i % len(batches)]
            _sync(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with context():
                loss = F.cross_entropy(model(x), y)
            if store is not None:  # bytes put this forward and not stored yet
                res.unstored = max(res.unstored or 0, store.stats.pending_bytes)
            if device.type == "cuda":
                fwd = torch.cuda.memory_allocated(device) - before
                res.cuda_fwd = max(res.cuda_fwd or 0, fwd)
            if store is not None:
                host_peak = max(host_peak, store.stats.host_bytes)
            loss.backward()
            opt.step()
            _sync(device)
            if i >= WARMUP:
                res.times.append(time.perf_counter() - t0)
            losses.append(loss.item())
            res.steps_run += 1
            if store is not None:
                host_peak = max(host_peak, store.stats.host_bytes)
                s = store.stats
                outside = s.peak_cpu_bytes + host_peak + s.peak_pending_bytes
                held = max(held, ac.stats.peak_device_bytes + outside)
        if device.type == "cuda":
            res.cuda_max = max(res.cuda_max or 0, torch.cuda.max_memory_allocated(device) - before)
        hwm = _proc_status("VmHWM")
        if rss0 is not None and hwm is not None:
            res.rss = max(res.rss or 0, hwm - rss0)
        if not res.losses:
            res.losses = losses
            res.loss = losses[-1]
            res.state = {
                **{f"w:{k}": v.detach().cpu().clone() for k, v in model.state_dict().items()},
                **{f"g:{k}": p.grad.detach().cpu().clone() for k, p in model.named_parameters()},
            }
        if store is not None:
            s = store.stats
            res.held = max(res.held or 0, held)
            res.written = (res.written or 0) + s.spilled_bytes  # per step at the end
            res.read = (res.read or 0) + s.read_bytes
            res.gets += s.gets
            res.prefetched_gets += s.prefetched_gets
            res.stored = ac.stats.stored_bytes
    finally:
        if store is not None:
            spill_path = store.spill.path if store.spill is not None else None
            store.close()
            if spill_path is not None and spill_path.exists():
                res.note += f"!! spill dir {spill_path} left after close; "


def _identical(a: TrainResult, b: TrainResult) -> bool:
    if a.losses != b.losses or a.state is None or b.state is None:
        return False
    return a.state.keys() == b.state.keys() and all(
        torch.equal(a.state[k], b.state[k]) for k in a.state
    )


def run_train(args: argparse.Namespace, markdown: bool) -> None:
    device = args.device
    batch = QUICK_BATCH if args.quick else BATCH
    steps = args.steps
    batches = make_batches(batch, device)
    torch.manual_seed(SEED)
    act = count_activation_bytes(MLP().to(device), *batches[0])
    cpu_small = int(act / args.cpu_fraction)
    cpu_all = 2 * act + 64 * MIB
    nvme = args.nvme_dir
    pin = device.type == "cuda"

    def plain():
        return contextlib.nullcontext, None, None

    def save_on_cpu():
        return (lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin)), None, None

    def store_variant(cpu_bytes: int, nvme_dir, codec: bool):
        def make():
            pending = cpu_bytes // 2 if nvme_dir is not None else None
            store = TieredStore(cpu_bytes, nvme_dir, max_pending_bytes=pending)
            if codec:
                ac = ActivationCompression("block", rel=REL, offload=store, min_bytes=MIN_BYTES)
            else:
                ac = offload_activations(store, min_bytes=MIN_BYTES)
            return (lambda: ac), ac, store

        return make

    variants = [
        ("(a) plain", plain),
        ("(b) save_on_cpu", save_on_cpu),
        ("(c) store cpu", store_variant(cpu_all, None, False)),
        ("(d) store nvme", store_variant(cpu_small, nvme, False)),
        (f"(e) store nvme+block {REL:g}", store_variant(cpu_small, nvme, True)),
    ]
    results = [TrainResult(name) for name, _ in variants]
    # untimed warm-up: the first variant must not pay for the first-touch costs
    train_variant(TrainResult("warm-up"), plain, batches, WARMUP, device)
    for rnd in range(args.rounds):
        for res, (name, make) in zip(results, variants, strict=True):
            if res.failed:
                continue
            t0 = time.perf_counter()
            try:
                train_variant(res, make, batches, steps, device)
            except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the run
                res.failed = True
                res.note += f"!! {type(exc).__name__}: {exc}; "
            print(
                f"  (round {rnd + 1}/{args.rounds} {name}: {time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    for res in results:
        if res.failed or not res.times:
            res.failed = True
            continue
        res.step_s = _median(res.times)
        if res.gets:
            res.prefetched = res.prefetched_gets / res.gets
        if res.written is not None:
            res.written /= res.steps_run
            res.read /= res.steps_run
        if res.variant.startswith(("(a)", "(b)")):
            res.held = act
            res.written = res.read = 0.0

    base = results[0]
    table = Table(
        f"train: residual GELU MLP (width {WIDTH}, {BLOCKS} blocks, batch {batch}, fp32), "
        f"{args.rounds} rounds x {steps} steps, step time = median of "
        f"{args.rounds * (steps - WARMUP)} steps "
        f"(after {WARMUP} warm-ups a round); activations {act / MIB:.1f} MiB/step; "
        f"cpu_bytes (c) {cpu_all / MIB:.0f} MiB, (d)/(e) {cpu_small / MIB:.1f} MiB "
        f"(1/{args.cpu_fraction:g})",
        [
            ("variant", 26, "<"),
            ("step ms", 7, ">"),
            ("step x (a)", 10, ">"),
            ("held MiB", 8, ">"),
            ("held x (a)", 10, ">"),
            ("disk write MiB/step", 19, ">"),
            ("disk read MiB/step", 18, ">"),
            ("prefetched gets", 15, ">"),
            ("unstored after fwd MiB", 22, ">"),
            ("RSS peak MiB", 12, ">"),
            ("final loss", 10, ">"),
            ("bit-identical to (a)", 20, ">"),
            ("cuda after fwd MiB", 18, ">"),
            ("cuda max MiB", 12, ">"),
            ("note", 4, "<"),
        ],
        markdown,
    )
    table.header()
    for r in results:
        if r is base:
            same = "ref" if r.step_s is not None else "-"
        elif r.step_s is None or base.step_s is None:
            same = "-"
        else:
            same = "yes" if _identical(base, r) else "no"
            if "block" in r.variant:
                same += " (lossy)"
        note = r.note
        if r.stored is not None and "block" in r.variant:
            note += f"stored {r.stored / MIB:.1f} MiB/step after the codec; "
        cuda = device.type == "cuda" and r.step_s is not None
        table.row(
            r.variant,
            _fmt(None if r.step_s is None else 1e3 * r.step_s, ".0f"),
            _fmt(_ratio(r.step_s, base.step_s), ".2f", "x"),
            _fmt(_ratio(r.held, MIB), ".1f"),
            _fmt(_ratio(r.held, base.held), ".3f", "x"),
            _fmt(_ratio(r.written, MIB), ".1f"),
            _fmt(_ratio(r.read, MIB), ".1f"),
            _fmt(None if r.prefetched is None else 100 * r.prefetched, ".0f", "%"),
            _fmt(_ratio(r.unstored, MIB), ".1f"),
            _fmt(_ratio(r.rss, MIB), ".0f", na="n/a" if r.step_s is not None else "-"),
            _fmt(r.loss, ".6f"),
            same,
            _fmt(_ratio(r.cuda_fwd, MIB), ".1f") if cuda else "n/a",
            _fmt(_ratio(r.cuda_max, MIB), ".1f") if cuda else "n/a",
            note.rstrip("; "),
        )
    print()
    for r in results[2:4]:
        if r.step_s is not None and base.step_s is not None and not _identical(base, r):
            print(f"!! {r.variant}: losses/gradients/weights differ from (a) (codec=None)")
    e = results[-1]
    if e.step_s is None or base.step_s is None:
        why = (e.note or base.note).rstrip("; ")
        print(f"train target ({e.variant}): NOT MET (no result: {why})")
    else:
        frac, time_x = e.held / base.held, e.step_s / base.step_s
        checks = [
            (frac <= TARGET_HELD_FRACTION, f"held {frac:.3f}x of (a) (<= 0.1x)"),
            (time_x <= TARGET_TIME_X, f"step time {time_x:.2f}x (<= 1.5x)"),
        ]
        text = "; ".join(f"{what} {'MET' if ok else 'NOT MET'}" for ok, what in checks)
        verdict = "MET" if all(ok for ok, _ in checks) else "NOT MET"
        print(f"train target ({e.variant}): {verdict}: {text}")
        if 1 / args.cpu_fraction > TARGET_HELD_FRACTION:
            print(
                "  (the pool fills before anything spills, so held >= cpu_bytes = "
                f"1/{args.cpu_fraction:g} of (a) once the records fit in it, whatever the "
                "codec saves: <= 0.1x needs --cpu-fraction > 10)"
            )


# =========================================================================== main


def leftover_spill_dirs(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(PREFIX))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="NVMe tier bandwidth vs the raw disk, and training with spilled "
        "saved activations."
    )
    p.add_argument("--only", choices=("disk", "train"), default=None, help="run one part only")
    p.add_argument("--device", default=None, help="torch device (default cuda if available)")
    p.add_argument(
        "--nvme-dir",
        type=Path,
        default=DEFAULT_NVME_DIR,
        help=f"directory for the files (default {DEFAULT_NVME_DIR})",
    )
    p.add_argument(
        "--disk-mib",
        type=int,
        default=None,
        help=f"MiB per disk measurement (default {DEFAULT_DISK_MIB}; {QUICK_DISK_MIB} quick)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"steps per variant and round (default {STEPS}; {QUICK_STEPS} quick)",
    )
    p.add_argument(
        "--cpu-fraction",
        type=float,
        default=DEFAULT_CPU_FRACTION,
        help="(d)/(e) cpu_bytes = activation bytes / this (default 8)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"rounds of all variants in turn (default {ROUNDS}; {QUICK_ROUNDS} quick)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: smaller model and files")
    p.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    args = p.parse_args(argv)
    args.disk_mib = args.disk_mib or (QUICK_DISK_MIB if args.quick else DEFAULT_DISK_MIB)
    args.steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    args.rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    if args.steps <= WARMUP:
        p.error(f"--steps must exceed the {WARMUP} warm-up steps")
    if args.cpu_fraction <= 1:
        p.error("--cpu-fraction must be > 1")
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return args


def _filesystem(path: Path) -> str:
    """The filesystem type of ``path`` from /proc/mounts (longest mount prefix)."""
    best, kind = "", "?"
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        real = str(path.resolve())
        for line in f:
            parts = line.split()
            if len(parts) > 2 and real.startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], f"{parts[2]} on {parts[0]}"
    return kind


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.nvme_dir.mkdir(parents=True, exist_ok=True)
    device = args.device
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print("Offload benchmark (MiB = 2**20 bytes, GB = 1e9 bytes; medians and ratios)")
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} cpus, {torch.get_num_threads()} torch threads, "
        f"device {device}{gpu}"
    )
    print(f"nvme dir {args.nvme_dir} ({_filesystem(args.nvme_dir)})")
    if not hasattr(os, "O_DIRECT"):
        print("note: no os.O_DIRECT on this platform: the disk part is skipped")
    sys.stdout.flush()
    before = set(leftover_spill_dirs(args.nvme_dir))
    if args.only in (None, "disk") and hasattr(os, "O_DIRECT"):
        t0 = time.perf_counter()
        run_disk(args, args.markdown)
        print(f"(disk: {time.perf_counter() - t0:.0f} s)", flush=True)
    if args.only in (None, "train"):
        t0 = time.perf_counter()
        run_train(args, args.markdown)
        print(f"(train: {time.perf_counter() - t0:.0f} s)", flush=True)
    gc.collect()
    left = [d for d in leftover_spill_dirs(args.nvme_dir) if d not in before]
    print(
        f"leftover spill directories in {args.nvme_dir}: " + (", ".join(left) if left else "none")
    )
    if before:
        print(f"  (present before this run, not ours: {', '.join(sorted(before))})")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
