"""Loader benchmark: torch's DataLoader over a plain h5py dataset against tensorpress's
``DataLoader`` over an ``H5Dataset``, reading from disk.

The data: an HDF5 file of float32 samples of 256 KiB (65536 floats) each, chunked 4
samples per chunk along axis 0 (1 MiB chunks, as real scientific files are), with int64
labels (``y``); 1 GiB by default (4096 samples), 192 MiB with ``--quick`` (768). The file
is cached under ``benchmarks/.cache/loader/`` and reused when it has the right shape,
chunks and dtypes. It is dropped from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``, each file ``fsync``'ed once at the warm-up)
before each run and each epoch, untimed, so every epoch starts from disk.

Variants, each 3 epochs (2 with ``--quick``), batch 32, ``--workers`` workers (default
2), ``persistent_workers=False``:

  (a) torch + h5py      ``torch.utils.data.DataLoader(shuffle=True)`` over a Dataset
                        written the way users write one: the file opened lazily in
                        ``__getitem__``, ``f["x"][i]`` and ``f["y"][i]`` per sample
  (b) tensorpress       ``tensorpress.loaders.DataLoader`` over ``H5Dataset(path, "x",
                        label_key="y")``, ``buffer_bytes`` = 1/4 of the data (default);
                        no user code runs in its workers, so they are threads of this
                        process, reading into the batch tensors (buffers live across
                        epochs)
  (b) processes         (b) with a no-op ``worker_init_fn``: worker processes, as when
                        a transform or collate function must run in them; each epoch's
                        workers exit
  (b) window=W          (b) with ``DataLoader(..., window=W)``, W = ``WINDOW_CHUNKS``
                        (64) chunks = 256 samples (64 MiB): chunks in a random order,
                        samples shuffled within each window of 64 chunks
  (b) 0 workers         (b) in this process, for ``loader.stats`` (hit rate)
  (c) block|sz, HDF5     (b) over a copy compressed by tensorpress (codec ``block`` or
                        ``sz`` at ``rel`` ``C_REL`` of the whole data's range) through
                        the HDF5 filter, one sample per chunk (``loader_copies.py``): a
                        miss reads its chunk's stored bytes with one positioned read and
                        decodes only its sample
  (c) block|sz, zarr     the same as a zarr v3 store (tensorpress's serializers, one
                        sample per chunk), read by ``ZarrDataset``
  (c) block, HDF5 4/chunk  ``files.compress_file``'s default copy: the filter layout keeps
                        the input's chunks of 4 samples, so a miss decodes 4 samples

This process runs torch with 1 thread, as torch's workers do: on few cores, torch's
OpenMP threads spinning beside numba's would slow ``torch.stack`` in ``default_collate``
down in the ``num_workers=0`` run, for a reason that is not the loader's.

Columns: samples/s (median over epochs) and its ratio to (a); samples per CPU second
(``getrusage``: this process's threads and its reaped worker processes; the cost of a
sample whatever the machine's load); MiB read from disk per
epoch (median) and its ratio to (a); for (c), the compressed copy's size on disk and the
bytes read per epoch over it (each stored chunk read at most once per epoch: <= 1).
Bytes read, with worker processes: the deltas of
``resource.getrusage(RUSAGE_CHILDREN).ru_inblock`` (512-byte blocks read by finished,
waited-for children: the epoch's workers; ``/proc/self/io`` ``read_bytes`` already
includes reaped children, so adding it would count them twice); without worker
processes: this process's ``read_bytes``. When ``ru_inblock`` stays 0 with workers the
kernel does not account it, and the bytes come from the device's
``/sys/dev/block/M:m/stat`` sectors read (the whole disk, printed for every row as a
cross-check anyway).

Hit rates of (b): the buffer hit rate over the epochs after the first, measured through
``loader.stats`` in the timed run of (b) (one buffer of ``buffer_bytes`` that the worker
threads share) and in a ``num_workers=0`` run (one buffer of ``buffer_bytes``), beside
what ``simulate`` gives on the same order: Belady's rule and LRU at the same capacity
(sample-level; tensorpress also buffers the chunk-mates of a miss, which ``simulate``
does not model). The per-worker line simulates each worker process's share (batches
round-robin) at capacity ``buffer_bytes / workers`` over all epochs (the buffers of
worker processes, as in "(b) processes").

Randomness: ``batch_chunk_spread`` of the default plan and of the windowed plan
(``ShufflePlan.batch_chunk_spread``, the mean number of distinct chunks in a batch of
32 over its expectation under a uniform shuffle, mean over the epochs; 1.0 = as spread as
a uniform shuffle, 4/32 = 0.125 = whole chunks per batch), printed beside the table, also
for a few other window sizes, so the bytes and speed gained sit next to the randomness
given up.

Targets (MET / NOT MET): (b) >= 5x (a)'s samples/s; (b) reads <= 1/3 of (a)'s bytes;
(b)'s hit rate >= 0.95 x the buffer's fraction of the dataset; every (c) row: samples/s
>= (b)'s and bytes read per epoch <= the compressed copy's size. With ``--rounds R``,
(b) and the (c) rows run R times in turn and the (c) / (b) ratio is the median of the
rounds' ratios (on a shared machine the load drifts from row to row). Also: the time to plan
``ShufflePlan(10_000_000, epochs=100, seed=0)``, all 100 epochs (target < 10 s), and
the Belady hit rate after the first of 3 epochs with a buffer as large as the dataset
split over 2 ranks (each rank's buffer = its half; target >= 99%).

    python benchmarks/loader.py                  # full run, about 2 min on 2 cores
    python benchmarks/loader.py --quick          # smoke run, under a minute
    python benchmarks/loader.py --workers 4 --size-mib 2048
    python benchmarks/loader.py --markdown       # tables for RESULTS.md
    python benchmarks/loader.py --memory-limit-mib 1024 --size-mib 4096   # larger than memory
    python benchmarks/loader.py --size-mib 2048 --epochs 2 --memory-limit-mib 1024 --rounds 3
    python benchmarks/loader.py ... --only 'block, HDF5' --only 'block, zarr'   # two (c) rows
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import itertools
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numba
import numpy as np
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

try:
    import loader_copies as copies
    from compressors import Table
    from compressors import fmt_cell as _fmt
    from compressors import ratio_or_none as _ratio
except ImportError:  # imported as benchmarks.loader
    from benchmarks import loader_copies as copies
    from benchmarks.compressors import Table
    from benchmarks.compressors import fmt_cell as _fmt
    from benchmarks.compressors import ratio_or_none as _ratio

from tensorpress.loaders import DataLoader, H5Dataset, ShufflePlan, ZarrDataset, simulate
from tensorpress.loaders.buffer import next_uses

MIB = 2**20
SEED = 0
SAMPLE_FLOATS = 65536  # 256 KiB of float32 per sample
SAMPLE_BYTES = SAMPLE_FLOATS * 4
CHUNK_SAMPLES = 4
DEFAULT_MIB, QUICK_MIB = 1024, 192
EPOCHS, QUICK_EPOCHS = 3, 2
BATCH = 32
DEFAULT_WORKERS = 2
BUFFER_FRACTION = 0.25
CLASSES = 10
DEFAULT_CACHE = Path(__file__).resolve().parent / ".cache" / "loader"
WRITE_BLOCK = 256  # samples per write
TARGET_SPEED_X = 5.0
TARGET_BYTES_X = 1 / 3
TARGET_HIT_X = 0.95
PLAN_SAMPLES, PLAN_EPOCHS, TARGET_PLAN_S = 10_000_000, 100, 10.0
TARGET_RANK_HIT = 0.99
C_REL = 1e-3  # (c): the bound of the compressed copies, relative to the value range
#: (c): the codecs of the compressed copies: ``block`` decodes faster, ``sz`` is smaller
C_CODECS = ("block", "sz")
WINDOW_CHUNKS = 64  # (b) window=W: W = WINDOW_CHUNKS * CHUNK_SAMPLES samples


# =========================================================================== the file


def data_path(cache: Path, n: int) -> Path:
    return cache / f"loader-{n}x{SAMPLE_FLOATS}-f32-c{CHUNK_SAMPLES}.h5"


def file_ok(path: Path, n: int) -> bool:
    """Whether ``path`` is a complete data file of ``n`` samples in our layout."""
    if not path.exists():
        return False
    try:
        with h5py.File(path, "r") as f:
            x, y = f.get("x"), f.get("y")
            return (
                isinstance(x, h5py.Dataset)
                and isinstance(y, h5py.Dataset)
                and x.shape == (n, SAMPLE_FLOATS)
                and x.dtype == np.float32
                and x.chunks == (CHUNK_SAMPLES, SAMPLE_FLOATS)
                and x.compression is None
                and y.shape == (n,)
                and y.dtype == np.int64
                and f.attrs.get("complete", False)
            )
    except OSError:
        return False


def make_file(path: Path, n: int) -> float:
    """Write the data file (to a temporary name, then renamed); returns seconds."""
    t0 = time.perf_counter()
    tmp = path.with_suffix(".h5.tmp")
    rng = np.random.default_rng(SEED)
    with h5py.File(tmp, "w") as f:
        x = f.create_dataset(
            "x", (n, SAMPLE_FLOATS), dtype=np.float32, chunks=(CHUNK_SAMPLES, SAMPLE_FLOATS)
        )
        f.create_dataset("y", data=rng.integers(0, CLASSES, n, dtype=np.int64))
        for start in range(0, n, WRITE_BLOCK):
            stop = min(start + WRITE_BLOCK, n)
            x[start:stop] = rng.standard_normal((stop - start, SAMPLE_FLOATS), dtype=np.float32)
        f.attrs["complete"] = True
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return time.perf_counter() - t0


def release_memory() -> None:
    """Free the previous row's loaders and hand the heap's free memory back to the
    system: what the reading threads allocated (batches, read buffers) is freed in their
    malloc arenas, where it would count against the memory limit of the next row."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


_SYNCED: set[str] = set()  # files fsync'ed once by this process


def drop_cache(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``,
    which drops clean pages only); for a directory (a zarr store), every file under it.
    Each file is fsync'ed the first time only: the benchmark never writes its files
    again, and an fsync even of a clean file costs a device cache flush here (about
    3 ms: 25 s for a zarr store's 8192 chunk files, against 0.2 s without it), which
    made the drop before a zarr epoch 100 times the HDF5 file's and loaded the disk
    the epoch then read from."""
    if path.is_dir():
        for d, _, files in os.walk(path):
            for name in files:
                drop_cache(Path(d) / name)
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if str(path) not in _SYNCED:
            os.fsync(fd)
            _SYNCED.add(str(path))
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def limit_memory(mib: int) -> str:
    """Move this process, and the children it starts from now on, into a new memory
    cgroup limited to ``mib`` MiB with the page cache included, so that a data file larger
    than the limit cannot stay cached: the file behaves as one larger than memory. Returns
    the cgroup's path; OSError where cgroups (v1 or v2) are not writable. At exit this
    process moves back and the cgroup is removed."""
    import atexit

    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [ln.split(":", 2)[2] for ln in lines if ln.split(":", 2)[1] == "memory"]
    if v1:
        parent, limit_file = Path("/sys/fs/cgroup/memory" + v1[0]), "memory.limit_in_bytes"
    else:
        v2 = [ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")]
        if not v2:
            raise OSError("no memory cgroup found in /proc/self/cgroup")
        parent, limit_file = Path("/sys/fs/cgroup" + v2[0]), "memory.max"
    group = parent / f"tensorpress-loader-{os.getpid()}"
    group.mkdir()
    (group / limit_file).write_text(str(mib * MIB))
    (group / "cgroup.procs").write_text(str(os.getpid()))

    def leave() -> None:
        with contextlib.suppress(OSError):
            (parent / "cgroup.procs").write_text(str(os.getpid()))
            group.rmdir()

    atexit.register(leave)
    return str(group)


def cached_fraction(path: Path) -> float | None:
    """Fraction of ``path``'s pages in the page cache (``mincore`` over a mapping), or
    None where that fails."""
    import ctypes
    import mmap

    size = path.stat().st_size
    if not size:
        return 0.0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        with open(path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY)  # no page touched
            anchor = ctypes.c_char.from_buffer(mm)
            rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
            del anchor
            mm.close()
        if rc != 0:
            return None
        return sum(v & 1 for v in vec) / pages
    except (OSError, AttributeError, TypeError, ValueError, BufferError):
        return None


# =========================================================================== reads


def _self_read_bytes() -> int | None:
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _device_stat(path: Path) -> Path | None:
    st = os.stat(path)
    p = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat")
    return p if p.exists() else None


@dataclass
class Reads:
    """Counters read at one moment: children's blocks, this process's bytes, the disk's."""

    children: int
    own: int | None
    disk: int | None

    @staticmethod
    def now(stat: Path | None) -> Reads:
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512
        disk = None
        if stat is not None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                disk = int(stat.read_text().split()[2]) * 512
        return Reads(children, _self_read_bytes(), disk)

    def since(self, before: Reads) -> tuple[int, int | None, int | None]:
        own = None if self.own is None or before.own is None else self.own - before.own
        disk = None if self.disk is None or before.disk is None else self.disk - before.disk
        return self.children - before.children, own, disk


# =========================================================================== variants


class PlainH5(Dataset):
    """A Dataset as users write one: the file opened lazily, one sample per read."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.file: h5py.File | None = None
        with h5py.File(self.path, "r") as f:
            self.n = f["x"].shape[0]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        return torch.from_numpy(self.file["x"][i]), int(self.file["y"][i])


@dataclass
class Result:
    name: str
    rates: list[float] = field(default_factory=list)  # samples/s per epoch
    #: samples per CPU second per epoch (this process's threads and its reaped workers)
    cpu_rates: list[float] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)  # bytes read from the file per epoch
    disk: list[int] = field(default_factory=list)  # device sectors read * 512 per epoch
    source: str = ""
    stats: list[dict] = field(default_factory=list)  # loader.stats after each epoch
    note: str = ""
    stored: int | None = None  # bytes of the compressed copy read, (c) rows


def _cpu_seconds() -> float:
    """CPU seconds used so far by this process (all its threads) and by its reaped
    children (the epochs' worker processes, which exit with the epoch)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _usage() -> tuple[float, int]:
    """(kernel CPU seconds, minor page faults) so far, this process and reaped children:
    where a first epoch's extra time goes (first touch of memory shows in both)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_stime + kids.ru_stime, own.ru_minflt + kids.ru_minflt


_HELD: list = []  # the last row's loader, kept until the next row's first drop


def run_epochs(
    name: str, loader, path: Path, epochs: int, workers: int, persistent: bool = False
) -> Result:
    """Iterate ``loader`` ``epochs`` times, dropping the file from the cache before each.

    The previous row's loader (``_HELD``) is freed after the first drop, right before
    the timer: this VM hands memory left free for about 2 s back to its host (free page
    reporting), and touching it again costs a host fault per page (``clear_page``: 1.1 s
    of a zarr first epoch, 0.05 s of HDF5's). Freed before the drop, the previous row's
    buffer went back to the host during a zarr store's drop (8192 files, 1-2 s) and not
    during an HDF5 file's (0.05 s), so zarr's first epoch refilled its buffer from cold
    memory and HDF5's from warm."""
    res = Result(name)
    stat = _device_stat(path)
    in_process = getattr(loader, "stats", None) is not None  # no worker processes
    for e in range(epochs):
        t_drop = time.perf_counter()
        drop_cache(path)  # before the timer: the epoch starts with the copy on disk only
        t_drop = time.perf_counter() - t_drop
        if e == 0:
            _HELD.clear()
            release_memory()
        before = Reads.now(stat)
        t0, c0, u0 = time.perf_counter(), _cpu_seconds(), _usage()
        seen = 0
        for _x, y in loader:
            seen += len(y)
        dt, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
        sys_s, faults = (b - a for a, b in zip(u0, _usage(), strict=True))
        children, own, disk = Reads.now(stat).since(before)
        if in_process and own is not None:
            res.bytes.append(own)
            res.source = "/proc/self/io read_bytes"
        elif workers and persistent:
            if disk is not None:
                res.bytes.append(disk)
            res.source = "device sectors read (persistent workers have not exited)"
        elif workers and children:
            res.bytes.append(children)  # /proc/self/io already includes reaped children
            res.source = "ru_inblock (children)"
        elif disk is not None:
            res.bytes.append(disk)
            res.source = "device sectors read (ru_inblock was 0)"
        if disk is not None:
            res.disk.append(disk)
        res.rates.append(seen / dt)
        if cpu > 0:
            res.cpu_rates.append(seen / cpu)
        stats = getattr(loader, "stats", None)
        if stats is not None:
            res.stats.append(dict(stats))
        print(
            f"  {name}: epoch {e + 1}/{epochs} {seen} samples in {dt:.1f} s "
            f"(CPU {cpu:.1f} s, of it kernel {sys_s:.1f} s; {faults:.0f} minor faults; "
            f"cache dropped in {t_drop:.2f} s before)",
            file=sys.stderr,
            flush=True,
        )
    _HELD[:] = [loader]  # freed by the next row, after its first drop
    return res


def run_torch(path: Path, epochs: int, workers: int) -> Result:
    loader = TorchDataLoader(
        PlainH5(path),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=False,
        generator=torch.Generator().manual_seed(SEED),
    )
    return run_epochs("(a) torch + h5py", loader, path, epochs, workers)


ONLY: list[str] = []  # --only: the (c) rows to run (empty: all)


def c_variants():
    """(row name, maker of the compressed copy: path -> (copy's path, note)) of the (c)
    rows: both codecs in the HDF5 filter layout and in zarr, one sample per chunk; and
    ``block`` as ``compress_file`` writes it by default (the input's chunks); only those
    named by ``--only``, if given."""
    out = [(name, make) for name, make in _all_c_variants() if not ONLY or name in ONLY]
    return out


def _all_c_variants():
    out = []
    for codec in C_CODECS:
        out.append((f"{codec}, HDF5", functools.partial(copies.h5_copy, codec=codec, rel=C_REL)))
    for codec in C_CODECS:
        out.append((f"{codec}, zarr", functools.partial(copies.zarr_copy, codec=codec, rel=C_REL)))
    chunks = f"{CHUNK_SAMPLES}/chunk"
    cli = functools.partial(copies.cli_copy, codec="block", rel=C_REL, chunk_bytes=SAMPLE_BYTES)
    out.append((f"block, HDF5 {chunks}", cli))
    return out


def more_rounds(
    path: Path, args, buffer_bytes: int, res_b: Result, res_c: dict
) -> tuple[dict, dict]:
    """Each (c) row's samples/s over (b)'s, one ratio per round: the first from the main
    pass, then ``args.rounds - 1`` more rounds of (b) and every (c) row in turn (on a
    shared machine the load drifts between rows; ratios within a round see about the
    same load, and their median over rounds is what the targets take); and the same
    ratios of samples per CPU second. Every other round runs the (c) rows in reverse
    order: a row's first epoch is faster after a row that read the same kind of copy
    (a zarr store after a zarr store), so a fixed order favours whichever row follows
    its own kind."""

    def per_cpu(c: Result, b: Result) -> float | None:
        return _ratio(_median(c.cpu_rates), _median(b.cpu_rates))

    ratios = {name: [_ratio(_median(r.rates), _median(res_b.rates))] for name, r in res_c.items()}
    cpu_ratios = {name: [per_cpu(r, res_b)] for name, r in res_c.items()}
    for r in range(1, args.rounds):
        b = run_epochs(
            f"(b) tensorpress, round {r + 1}",
            make_tp(path, args.workers, buffer_bytes),
            path,
            args.epochs,
            args.workers,
        )
        variants = c_variants()
        for name, make in variants[::-1] if r % 2 else variants:
            cpath, _ = make(path)
            c = run_epochs(
                f"(c) {name}, round {r + 1}",
                make_tp(cpath, args.workers, buffer_bytes),
                cpath,
                args.epochs,
                args.workers,
            )
            ratios[name].append(_ratio(_median(c.rates), _median(b.rates)))
            cpu_ratios[name].append(per_cpu(c, b))
    for name, xs in ratios.items():
        print(f"  (c) {name} / (b) samples/s by round: " + ", ".join(f"{x:.2f}" for x in xs))
        cpus = ", ".join(_fmt(x, ".2f") for x in cpu_ratios[name])
        print(f"  (c) {name} / (b) samples per CPU-s by round: {cpus}")
    return ratios, cpu_ratios


def warm_up(path: Path, n: int) -> None:
    """Load what a process loads once (numba's machinery and the cached kernels of the
    plan, the buffer and each copy's decoder) before any row is timed, so the first
    row of a kind does not pay it in its first epoch: read one sample of each copy."""
    t0 = time.perf_counter()
    next_uses(ShufflePlan(n, seed=SEED, shuffle=True).indices(0))
    drop_cache(path)
    for _, make in c_variants():
        cpath, _ = make(path)
        (ZarrDataset if cpath.is_dir() else H5Dataset)(cpath, "x").read_range(0, 1)
        drop_cache(cpath)  # its one fsync per file here, not before a row's first epoch
    print(f"warm-up (kernels loaded, copies made): {time.perf_counter() - t0:.1f} s", flush=True)


def _no_init(worker_id: int) -> None:
    """A worker_init_fn that does nothing: it makes the workers processes."""


def make_tp(
    path: Path,
    workers: int,
    buffer_bytes: int,
    persistent: bool = False,
    window: int = 0,
    processes: bool = False,
) -> DataLoader:
    ds = (ZarrDataset if path.is_dir() else H5Dataset)(path, "x", label_key="y")
    loader = DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        buffer_bytes=buffer_bytes,
        seed=SEED,
        persistent_workers=persistent and workers > 0,
        window=window,
        worker_init_fn=_no_init if processes else None,
    )
    return loader


def chunk_spread(n: int, epochs: int, window: int) -> float:
    """Mean over ``epochs`` of ``batch_chunk_spread`` (batch ``BATCH``) of the plan."""
    plan = ShufflePlan(n, epochs=epochs, seed=SEED, chunk_samples=CHUNK_SAMPLES, window=window)
    return statistics.mean(plan.batch_chunk_spread(e, BATCH) for e in range(epochs))


# =========================================================================== tables


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _known(xs: Sequence[float | None]) -> list[float]:
    return [x for x in xs if x is not None]


def _met(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def orders(n: int, epochs: int, workers: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(the one-process order over ``epochs``, each worker's share over ``epochs``)."""
    plan = ShufflePlan(n, epochs=epochs, seed=SEED)
    whole, shares = [], [[] for _ in range(max(1, workers))]
    for e in range(epochs):
        order = plan.indices(e)
        whole.append(order)
        b = np.arange(order.size) // BATCH
        for w, share in enumerate(shares):
            share.append(order[b % len(shares) == w])
    return np.concatenate(whole), [np.concatenate(s) for s in shares]


def hit_rate_after_first(stats: list[dict]) -> float | None:
    if len(stats) < 2:
        return None
    hits = stats[-1]["hits"] - stats[0]["hits"]
    misses = stats[-1]["misses"] - stats[0]["misses"]
    return hits / (hits + misses) if hits + misses else None


def plan_time() -> tuple[float, float]:
    """(seconds for a first small call, which loads numba's compiled kernel when this
    process has not yet; seconds for all epochs)."""
    t0 = time.perf_counter()
    ShufflePlan(1000, epochs=1, seed=SEED).indices(0)
    warm = time.perf_counter() - t0
    plan = ShufflePlan(PLAN_SAMPLES, epochs=PLAN_EPOCHS, seed=SEED)
    t0 = time.perf_counter()
    for e in range(PLAN_EPOCHS):
        plan.indices(e)
    return warm, time.perf_counter() - t0


def rank_hit_rate(n: int, shard: str, epochs: int = 3, world: int = 2) -> list[tuple[float, float]]:
    """Per rank (Belady, LRU) hit rate after the first epoch, buffer = the rank's half."""
    out = []
    for r in range(world):
        plan = ShufflePlan(n, epochs=epochs, seed=SEED, world_size=world, rank=r, shard=shard)
        order = np.concatenate([plan.indices(e) for e in range(epochs)])
        cap = len(plan)  # one byte per sample: the rank's share of the dataset
        out.append(
            (
                simulate(order, 1, cap, "belady", warmup=len(plan)),
                simulate(order, 1, cap, "lru", warmup=len(plan)),
            )
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    md = args.markdown
    n = args.size_mib * MIB // SAMPLE_BYTES
    n -= n % CHUNK_SAMPLES
    data_bytes = n * SAMPLE_BYTES
    buffer_bytes = int(data_bytes * args.buffer_fraction)
    args.cache.mkdir(parents=True, exist_ok=True)
    path = data_path(args.cache, n)

    print("Loader benchmark (MiB = 2**20 bytes; medians over epochs and ratios to (a))")
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
        f"h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version}), {platform.machine()}, "
        f"{os.cpu_count()} cpus, numba {numba.__version__} ({numba.get_num_threads()} threads), "
        f"kernel {platform.release()}"
    )
    ra = _read_ahead(path.parent)
    print(
        f"data {path} : {n} samples x {SAMPLE_BYTES // 1024} KiB float32 = "
        f"{data_bytes / MIB:.0f} MiB, chunks of {CHUNK_SAMPLES} samples "
        f"({CHUNK_SAMPLES * SAMPLE_BYTES // MIB} MiB), int64 labels; read_ahead_kb {ra}"
    )
    print(
        f"{args.epochs} epochs, batch {BATCH}, {args.workers} workers "
        f"(persistent_workers=False), buffer_bytes {buffer_bytes / MIB:.0f} MiB "
        f"({args.buffer_fraction:g} of the data)"
    )
    if args.memory_limit_mib:
        group = limit_memory(args.memory_limit_mib)
        print(f"memory (page cache included) limited to {args.memory_limit_mib} MiB: {group}")
    if file_ok(path, n):
        print("data file: reused")
    else:
        print(f"data file: written in {make_file(path, n):.1f} s")
    drop_cache(path)
    frac = cached_fraction(path)
    print(
        "page cache after dropping: "
        + ("unknown (mincore failed)" if frac is None else f"{frac:.1%} of the file resident")
    )
    sys.stdout.flush()

    # workers run torch with 1 thread (torch's worker loop sets it); so does this process,
    # where the num_workers=0 run collates: torch's OpenMP threads spinning beside numba's
    # would slow torch.stack in default_collate (module docstring)
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    warm_up(path, n)
    res_a = run_torch(path, args.epochs, args.workers)
    res_b = run_epochs(
        "(b) tensorpress",
        make_tp(path, args.workers, buffer_bytes),
        path,
        args.epochs,
        args.workers,
    )
    res_bp = None
    if args.workers:
        res_bp = run_epochs(
            "(b) tensorpress, processes",
            make_tp(path, args.workers, buffer_bytes, processes=True),
            path,
            args.epochs,
            args.workers,
        )
    window = WINDOW_CHUNKS * CHUNK_SAMPLES
    res_bw = None
    if args.workers:
        res_bw = run_epochs(
            f"(b) tensorpress, window={window}",
            make_tp(path, args.workers, buffer_bytes, persistent=True, window=window),
            path,
            args.epochs,
            args.workers,
            persistent=True,
        )
    res_b0 = run_epochs(
        "(b) tensorpress, 0 workers",
        make_tp(path, 0, buffer_bytes),
        path,
        args.epochs,
        0,
    )
    res_c = {}
    for name, make in c_variants():
        cpath, c_note = make(path)
        print(f"(c) data: {cpath.name}: {c_note}", flush=True)
        res_c[name] = run_epochs(
            f"(c) {name}",
            make_tp(cpath, args.workers, buffer_bytes),
            cpath,
            args.epochs,
            args.workers,
        )
        res_c[name].stored = copies.stored_bytes(cpath)
    c_ratios, c_cpu = more_rounds(path, args, buffer_bytes, res_b, res_c)
    a_rate, a_bytes = _median(res_a.rates), _median(res_a.bytes)

    table = Table(
        f"loading {data_bytes / MIB:.0f} MiB from disk, {args.epochs} epochs, batch {BATCH}",
        [
            ("variant", 30, "<"),
            ("workers", 7, ">"),
            ("samples/s", 9, ">"),
            ("x (a)", 6, ">"),
            ("samples/CPU-s", 13, ">"),
            ("MiB read/epoch", 14, ">"),
            ("x (a) bytes", 11, ">"),
            ("disk MiB/epoch", 14, ">"),
            ("stored MiB", 10, ">"),
            ("read / stored", 13, ">"),
            ("spread", 6, ">"),
            ("note", 4, "<"),
        ],
        md,
    )
    table.header()
    spread = {w: chunk_spread(n, args.epochs, w) for w in (0, window)}
    rows = [
        (res_a, args.workers),
        (res_b, args.workers),
        (res_bp, args.workers),
        (res_bw, args.workers),
        (res_b0, 0),
        *((res, args.workers) for res in res_c.values()),
    ]
    rows = [(res, w) for res, w in rows if res is not None]
    for res, workers in rows:
        rate, nbytes = _median(res.rates), _median(res.bytes)
        disk = _median(res.disk)
        table.row(
            res.name,
            str(workers),
            _fmt(rate, ".0f"),
            _fmt(_ratio(rate, a_rate), ".2f", "x"),
            _fmt(_median(res.cpu_rates), ".0f", na="n/a"),
            _fmt(None if nbytes is None else nbytes / MIB, ".0f", na="n/a"),
            _fmt(_ratio(nbytes, a_bytes), ".2f", "x", na="n/a"),
            _fmt(None if disk is None else disk / MIB, ".0f", na="n/a"),
            "-" if res.stored is None else f"{res.stored / MIB:.0f}",
            "-" if res.stored is None else _fmt(_ratio(nbytes, res.stored), ".2f", "x"),
            "-" if res is res_a else f"{spread[window if res is res_bw else 0]:.3f}",
            res.source,
        )
    print()
    for res, _ in rows:
        per = ", ".join(
            f"{r:.0f}/s {b / MIB:.0f} MiB" for r, b in zip(res.rates, res.bytes, strict=False)
        )
        print(f"  per epoch {res.name}: {per}")
        if res.stored and res.stats:  # what the loader fetched, page cache or not
            counts = [0] + [st["chunk_bytes_read"] for st in res.stats]
            fetched = ", ".join(
                f"{(b - a) / res.stored:.2f}x" for a, b in itertools.pairwise(counts)
            )
            print(f"    stored bytes the loader read (chunk_bytes_read) / stored: {fetched}")
    print(
        "  spread: batch_chunk_spread, distinct chunks per batch of "
        f"{BATCH} / uniform expectation (1 = uniform shuffle, "
        f"{CHUNK_SAMPLES / BATCH:.3f} = whole chunks); (a) is a uniform shuffle"
    )
    others = ", ".join(
        f"window={w * CHUNK_SAMPLES}: {chunk_spread(n, args.epochs, w * CHUNK_SAMPLES):.3f}"
        for w in (8, 16, 32, 64, 128)
        if w * CHUNK_SAMPLES <= n
    )
    print(f"  spread of other windows (chunks of {CHUNK_SAMPLES}): {others}")
    if args.workers and not any(res_a.bytes) and not any(res_b.bytes):
        print("  note: no read counter moved with workers (ru_inblock and device stats)")
    print(f"(loaders: {time.perf_counter() - t_start:.0f} s)", flush=True)

    # hit rates
    whole, shares = orders(n, args.epochs, args.workers)
    per_worker_cap = buffer_bytes // max(1, args.workers)
    measured = hit_rate_after_first(res_b0.stats)
    bel = simulate(whole, SAMPLE_BYTES, buffer_bytes, "belady", warmup=n)
    lru = simulate(whole, SAMPLE_BYTES, buffer_bytes, "lru", warmup=n)
    w_bel = [
        simulate(s, SAMPLE_BYTES, per_worker_cap, "belady", warmup=s.size // args.epochs)
        for s in shares
    ]
    w_lru = [
        simulate(s, SAMPLE_BYTES, per_worker_cap, "lru", warmup=s.size // args.epochs)
        for s in shares
    ]
    first = res_b0.stats[0] if res_b0.stats else None
    first_rate = (
        first["hits"] / (first["hits"] + first["misses"])
        if first and first["hits"] + first["misses"]
        else None
    )
    table = Table(
        f"buffer hit rate after the first epoch, buffer {buffer_bytes / MIB:.0f} MiB "
        f"({args.buffer_fraction:g} of the data)",
        [("what", 52, "<"), ("capacity MiB", 12, ">"), ("hit rate", 8, ">")],
        md,
    )
    table.header()
    table.row(
        "(b) measured, 0 workers, loader.stats, epoch 1",
        f"{buffer_bytes / MIB:.0f}",
        _fmt(first_rate, ".3f"),
    )
    table.row(
        "(b) measured, 0 workers, loader.stats, epochs 2..",
        f"{buffer_bytes / MIB:.0f}",
        _fmt(measured, ".3f"),
    )
    if res_b.stats:
        table.row(
            f"(b) measured, {args.workers} worker threads, loader.stats, epochs 2..",
            f"{buffer_bytes / MIB:.0f}",
            _fmt(hit_rate_after_first(res_b.stats), ".3f"),
        )
    table.row(
        "Belady (simulate), one process, epochs 2..", f"{buffer_bytes / MIB:.0f}", f"{bel:.3f}"
    )
    table.row("LRU (simulate), one process, epochs 2..", f"{buffer_bytes / MIB:.0f}", f"{lru:.3f}")
    table.row(
        f"Belady (simulate), per worker process, mean of {len(shares)}",
        f"{per_worker_cap / MIB:.0f}",
        f"{statistics.mean(w_bel):.3f}",
    )
    table.row(
        f"LRU (simulate), per worker process, mean of {len(shares)}",
        f"{per_worker_cap / MIB:.0f}",
        f"{statistics.mean(w_lru):.3f}",
    )
    if res_b0.stats:
        last = res_b0.stats[-1]
        print(
            f"\n  (b) 0 workers, all epochs: hits {last['hits']}, misses {last['misses']}, "
            f"bytes_read {last['bytes_read'] / MIB:.0f} MiB, chunk_bytes_read "
            f"{last['chunk_bytes_read'] / MIB:.0f} MiB, buffer held "
            f"{last['buffer_bytes_held'] / MIB:.0f} MiB"
        )
    print(
        "  (simulate is sample-level; where the loader reads whole chunks it also offers a "
        "miss's\n   chunk-mates to the buffer: within-epoch hits the simulation does not make)"
    )

    # plan and ranks
    _, t_plan = plan_time()
    ranks = {shard: rank_hit_rate(n, shard) for shard in ("epoch", "fixed")}
    ranks_big = {shard: rank_hit_rate(1_000_000, shard) for shard in ("epoch", "fixed")}
    table = Table(
        "plan and sharding",
        [("what", 76, "<"), ("value", 12, ">"), ("target", 8, ">")],
        md,
    )
    table.header()
    table.row(
        f"ShufflePlan({PLAN_SAMPLES:_}, epochs={PLAN_EPOCHS}): all epochs",
        f"{t_plan:.2f} s",
        f"< {TARGET_PLAN_S:g} s",
    )
    for label, by_shard in ((f"{n}", ranks), ("1_000_000", ranks_big)):
        for shard, rs in by_shard.items():
            for r, (b, lr) in enumerate(rs):
                table.row(
                    f"2 ranks, shard={shard}, {label} samples, buffer = half, rank {r}: "
                    "Belady / LRU",
                    f"{b:.3f} / {lr:.3f}",
                    f">= {TARGET_RANK_HIT:g}" if shard == "fixed" else "",
                )

    # targets
    b_rate, b_bytes = _median(res_b.rates), _median(res_b.bytes)
    speed_x = _ratio(b_rate, a_rate)
    bytes_x = _ratio(b_bytes, a_bytes)
    hit_goal = TARGET_HIT_X * args.buffer_fraction
    rank_min = min(b for b, _ in ranks["fixed"] + ranks_big["fixed"])
    print()
    print("targets:")
    print(
        f"  (b) samples/s >= {TARGET_SPEED_X:g}x (a): {_fmt(speed_x, '.2f', 'x')} -> "
        f"{_met(speed_x is not None and speed_x >= TARGET_SPEED_X)}"
    )
    print(
        f"  (b) bytes read <= 1/3 of (a): {_fmt(bytes_x, '.2f', 'x')} -> "
        f"{_met(bytes_x is not None and bytes_x <= TARGET_BYTES_X)}"
    )
    print(
        f"  (b) hit rate >= {TARGET_HIT_X:g} x {args.buffer_fraction:g} = {hit_goal:.3f}: "
        f"{_fmt(measured, '.3f')} -> {_met(measured is not None and measured >= hit_goal)}"
    )
    for name, res in res_c.items():
        c_x = _median(c_ratios[name])
        read_x = _ratio(_median(res.bytes), res.stored)
        spread = ""
        if len(c_ratios[name]) > 1:
            lo, hi = min(c_ratios[name]), max(c_ratios[name])
            spread = f" (median of {len(c_ratios[name])} rounds, {lo:.2f}..{hi:.2f})"
        print(
            f"  (c) {name}: samples/s >= (b): {_fmt(c_x, '.2f', 'x')}{spread} -> "
            f"{_met(c_x is not None and c_x >= 1)}; bytes read per epoch <= stored: "
            f"{_fmt(read_x, '.2f', 'x')} -> {_met(read_x is not None and read_x <= 1)}; "
            f"samples per CPU-s over (b)'s: {_fmt(_median(_known(c_cpu[name])), '.2f', 'x')}"
        )
    print(
        f"  plan {PLAN_SAMPLES:_} x {PLAN_EPOCHS} epochs < {TARGET_PLAN_S:g} s: {t_plan:.2f} s -> "
        f"{_met(t_plan < TARGET_PLAN_S)}"
    )
    print(
        f"  2 ranks, shard='fixed', buffer = dataset, Belady hit rate >= {TARGET_RANK_HIT:g}: "
        f"{rank_min:.3f} -> {_met(rank_min >= TARGET_RANK_HIT)}"
    )
    print(f"data file kept for reuse: {path}")
    return 0


def _read_ahead(path: Path) -> str:
    with contextlib.suppress(OSError, ValueError):
        st = os.stat(path)
        dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        for q in (dev / "queue" / "read_ahead_kb", dev / ".." / "queue" / "read_ahead_kb"):
            if q.exists():
                return q.read_text().strip()
    return "?"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="torch DataLoader + h5py vs tensorpress DataLoader + H5Dataset, from disk."
    )
    p.add_argument(
        "--size-mib",
        type=int,
        default=None,
        help=f"MiB of samples (default {DEFAULT_MIB}; {QUICK_MIB} quick)",
    )
    p.add_argument(
        "--epochs", type=int, default=None, help=f"epochs (default {EPOCHS}; {QUICK_EPOCHS} quick)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help=f"worker processes (default {DEFAULT_WORKERS})",
    )
    p.add_argument(
        "--buffer-fraction",
        type=float,
        default=BUFFER_FRACTION,
        help=f"(b)'s buffer_bytes as a fraction of the data (default {BUFFER_FRACTION:g})",
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=DEFAULT_CACHE,
        help=f"directory of the data file (default {DEFAULT_CACHE})",
    )
    p.add_argument(
        "--memory-limit-mib",
        type=int,
        default=None,
        help="run in a memory cgroup of this many MiB, page cache included, so a file "
        "larger than it behaves as one larger than memory (needs a writable cgroup)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of (b) and the (c) rows, interleaved; targets take the median ratio",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="ROW",
        help="run only this (c) row (repeatable), e.g. --only 'block, zarr'",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: smaller file, 2 epochs")
    p.add_argument("--markdown", action="store_true", help="print tables as Markdown")
    args = p.parse_args(argv)
    args.size_mib = args.size_mib or (QUICK_MIB if args.quick else DEFAULT_MIB)
    args.epochs = args.epochs or (QUICK_EPOCHS if args.quick else EPOCHS)
    if args.epochs < 2:
        p.error("--epochs must be >= 2 (hit rates are taken after the first)")
    if args.workers < 0:
        p.error("--workers must be >= 0")
    names = [name for name, _ in _all_c_variants()]
    if any(name not in names for name in args.only):
        p.error(f"--only takes (c) row names: {', '.join(map(repr, names))}")
    ONLY[:] = args.only
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if not 0 < args.buffer_fraction <= 1:
        p.error("--buffer-fraction must be in (0, 1]")
    if args.size_mib * MIB // SAMPLE_BYTES < CHUNK_SAMPLES * BATCH:
        p.error("--size-mib too small")
    return args


if __name__ == "__main__":
    sys.exit(main())
