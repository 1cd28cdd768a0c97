"""DataLoader: every sample once per epoch per the DistributedSampler rules, batches equal
to h5py's own reads and to torch's DataLoader over the same index lists, reproducible
orders, exact resume, the Belady buffer's hit rates and chunk traffic, worker errors."""

from __future__ import annotations

import gc
import os
import time
import types
import warnings

import h5py
import numpy as np
import pytest
import torch
from tensorpress.loaders import DataLoader, H5Dataset, ShufflePlan
from tensorpress.loaders.lookahead import Lookahead
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset, DistributedSampler, default_collate

FEATURES = 6  # values per sample
CHUNK = 4  # samples per HDF5 chunk


def _values(n: int) -> np.ndarray:
    """Sample ``i`` holds ``i * 100 + 0 .. FEATURES - 1``: its index is readable back."""
    return (np.arange(n)[:, None] * 100 + np.arange(FEATURES)).astype(np.float32)


def _make(path, n: int, chunk: int = CHUNK, features: int = FEATURES) -> str:
    rng = np.random.default_rng(n)
    x = _values(n) if features == FEATURES else rng.standard_normal((n, features))
    chunk = min(chunk, n)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x.astype(np.float32), chunks=(chunk, features))
        f.create_dataset("y", data=np.arange(n, dtype=np.int64), chunks=(chunk,))
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Path of a labelled, chunked file of ``n`` samples, made once per ``n``."""
    made: dict[int, str] = {}
    root = tmp_path_factory.mktemp("dl")

    def get(n: int) -> str:
        if n not in made:
            made[n] = _make(root / f"d{n}.h5", n)
        return made[n]

    return get


def _epoch(loader) -> list[list[int]]:
    """One iteration of a loader over a labelled dataset: the sample indices per batch,
    checking each sample's values against its label."""
    out = []
    for x, y in loader:
        assert torch.equal(x, torch.from_numpy(_values(int(y.max()) + 1)[y.numpy()]))
        out.append(y.tolist())
    return out


def _torch_batches(n, batch_size, world_size, rank, drop_last) -> list[list[int]]:
    sampler = DistributedSampler(
        range(n), num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop_last
    )
    loader = TorchDataLoader(range(n), sampler=sampler, batch_size=batch_size, drop_last=drop_last)
    return [b.tolist() for b in loader]


def _equal(a, b) -> bool:
    """Structural equality of collated batches (tensors, sequences, dicts, scalars)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


# -- order: coverage, sharding, drop_last ---------------------------------------------


@pytest.mark.parametrize("n", [1, 10, 37])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_sample_once(files, n, batch_size, world_size, drop_last, shuffle):
    ds = H5Dataset(files(n), "x", label_key="y")
    if drop_last and n < world_size:
        with pytest.raises(ValueError, match="drop_last"):
            DataLoader(ds, batch_size, world_size=world_size, rank=0, drop_last=True)
        return
    ranks = []
    for rank in range(world_size):
        loader = DataLoader(
            ds, batch_size, shuffle=shuffle, drop_last=drop_last, world_size=world_size, rank=rank
        )
        batches = _epoch(loader)
        expected = _torch_batches(n, batch_size, world_size, rank, drop_last)
        assert len(loader) == len(batches) == len(expected)
        assert [len(b) for b in batches] == [len(b) for b in expected]
        if not shuffle:
            assert batches == expected
        ranks.append([i for b in batches for i in b])
    if not drop_last:  # ranks together: every sample, padding repeats first ones
        assert set().union(*ranks) == set(range(n))
        assert sum(map(len, ranks)) == world_size * -(-n // world_size)
    per_rank = n // world_size if drop_last and world_size > 1 else -(-n // world_size)
    if drop_last:  # no padding: ranks disjoint, no repeats
        flat = [i for r in ranks for i in r]
        assert len(flat) == len(set(flat))
        if world_size > 1:
            assert all(len(r) == per_rank // batch_size * batch_size for r in ranks)


def test_reproducible_and_epochs_differ(files):
    ds = H5Dataset(files(37), "x", label_key="y")
    a, b = DataLoader(ds, 3, seed=5, shuffle=True), DataLoader(ds, 3, seed=5, shuffle=True)
    e0, e1 = _epoch(a), _epoch(a)  # epochs advance by themselves
    assert _epoch(b) == e0 and _epoch(b) == e1
    assert e0 != e1
    assert _epoch(DataLoader(ds, 3, seed=6, shuffle=True)) != e0
    c = DataLoader(ds, 3, seed=5, shuffle=True)
    c.set_epoch(1)
    assert _epoch(c) == e1 and c.epoch == 2
    c.set_epoch(1)  # set_epoch every epoch, DistributedSampler style
    assert _epoch(c) == e1


def test_abandoned_iteration_restarts_epoch(files):
    ds = H5Dataset(files(37), "x", label_key="y")
    loader = DataLoader(ds, 4, seed=1, shuffle=True)
    full = _epoch(DataLoader(ds, 4, seed=1, shuffle=True))
    it = iter(loader)
    next(it)
    assert loader.state_dict()["batches_done"] == 1
    assert _epoch(loader) == full


# -- values -----------------------------------------------------------------------------


def test_values_equal_h5py(tmp_path):
    path = _make(tmp_path / "r.h5", 50, chunk=7, features=5)
    with h5py.File(path) as f:
        x, y = f["x"][...], f["y"][...]
    ds = H5Dataset(path, "x", label_key="y")
    # a small buffer, several epochs: hits and misses, slots given back and reused
    loader = DataLoader(ds, 8, buffer_bytes=300, seed=3, shuffle=True)
    for _ in range(4):
        seen = []
        for xb, yb in loader:
            idx = yb.numpy()
            assert np.array_equal(xb.numpy(), x[idx]) and np.array_equal(idx, y[idx])
            seen.extend(idx.tolist())
        assert sorted(seen) == list(range(50))
        assert 0 < loader.stats["buffer_bytes_held"] <= 300
    assert 0 < loader.stats["hits"] and 0 < loader.stats["misses"]


def test_a_buffer_the_machine_cannot_reserve_says_what_to_do(tmp_path, monkeypatch):
    path = _make(tmp_path / "m.h5", 20, chunk=4, features=5)
    loader = DataLoader(
        H5Dataset(path, "x", label_key="y"), 4, buffer_bytes=10**6, seed=0, shuffle=True
    )

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(  # the slots' one array cannot be made; nothing else changes
        "tensorpress.loaders.slots.np", types.SimpleNamespace(empty=no_memory)
    )
    with pytest.raises(MemoryError, match="pass a smaller buffer_bytes"):
        next(iter(loader))


def _same_as_torch(loader, dataset, collate_fn=None):
    """Our loader's batches equal torch's over the same index lists, epoch by epoch."""
    for epoch in range(2):
        order = loader.sampler.indices(epoch)
        bs = loader.batch_size
        lists = [order[i : i + bs].tolist() for i in range(0, len(order), bs)]
        if loader.drop_last and len(lists[-1]) < bs:
            lists.pop()
        ref = TorchDataLoader(dataset, batch_sampler=lists, collate_fn=collate_fn)
        ours = list(loader)
        assert len(ours) == len(lists) == len(loader)
        assert all(_equal(a, b) for a, b in zip(ours, ref, strict=True))


@pytest.mark.parametrize("labels", [True, False])
def test_same_as_torch_dataloader(files, labels):
    ds = H5Dataset(files(37), "x", label_key="y" if labels else None, transform=lambda a: a * 2)
    loader = DataLoader(ds, 8, buffer_bytes=24 * 37, world_size=2, rank=1, shuffle=True)
    _same_as_torch(loader, ds)
    loader = DataLoader(ds, 3, drop_last=True, collate_fn=list, buffer_bytes=0, shuffle=True)
    _same_as_torch(loader, ds, collate_fn=list)


def _init(worker_id):
    """A worker_init_fn: user code in the workers, so they are processes."""


@pytest.mark.parametrize("labels", [True, False])
@pytest.mark.parametrize("workers", ["none", "threads", "processes"])
def test_batches_read_into_the_collated_tensors_are_torchs(tmp_path, monkeypatch, labels, workers):
    """No transform and torch's collate: batches are read straight into the batch tensors,
    by reading threads when no user code needs worker processes; the same batches."""
    n = 37
    path = _make(tmp_path / "c.h5", n, chunk=4, features=FEATURES)
    with h5py.File(path, "a") as f:  # one-sample chunks; whole gzip chunks with chunk-mates
        f.create_dataset("z", data=_values(n), chunks=(1, FEATURES))
        f.create_dataset("g", data=_values(n), chunks=(4, FEATURES), compression="gzip")
    if workers == "none":  # labels read from the file, not kept in memory
        monkeypatch.setattr("tensorpress.loaders.h5dataset.LABEL_MEMORY_BYTES", 0)
    for key in ("x", "z", "g"):
        ds = H5Dataset(path, key, label_key="y" if labels else None)
        kw = {
            "none": {},
            "threads": {"num_workers": 2},
            "processes": {"num_workers": 2, "worker_init_fn": _init},
        }[workers]
        for batch in (8, 19):  # 19: the rank's whole epoch in one batch
            loader = DataLoader(
                ds, batch, buffer_bytes=5 * 24, world_size=2, rank=1, **kw, shuffle=True
            )
            assert loader.collate_fn is default_collate
            _same_as_torch(loader, ds)
        stats = loader.stats  # reading threads count in this process, processes in theirs
        if workers == "processes":
            assert stats is None
        else:
            assert stats["hits"] > 0 and stats["misses"] > 0


class _Generic(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"i": i, "v": torch.full((2,), float(i)), "name": f"s{i}"}


class _Collated(_Generic):
    def __getitems__(self, indices):
        return {"indices": list(indices)}  # a whole batch: torch passes it on as it is


def test_generic_dataset():
    ds = _Collated(23)
    loader = DataLoader(ds, 5, collate_fn=lambda batch: batch, seed=2, shuffle=True)
    _same_as_torch(loader, ds, collate_fn=lambda batch: batch)
    ds = _Generic(23)
    loader = DataLoader(ds, 5, seed=2, shuffle=True)
    _same_as_torch(loader, ds)
    assert loader.stats is None
    plain = DataLoader(list(range(10)), 4, shuffle=False)
    assert [b.tolist() for b in plain] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


# -- workers ----------------------------------------------------------------------------


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_workers_match_single_process(files, workers):
    ds = H5Dataset(files(37), "x", label_key="y")
    ranks = []
    for rank in (0, 1):
        ref = DataLoader(ds, 3, world_size=2, rank=rank, seed=4, shuffle=True)
        init = _init if workers == "processes" else None
        par = DataLoader(
            ds,
            3,
            world_size=2,
            rank=rank,
            seed=4,
            num_workers=2,
            persistent_workers=True,
            worker_init_fn=init,
            shuffle=True,
        )
        epochs = [_epoch(par) for _ in range(2)]
        assert epochs == [_epoch(ref) for _ in range(2)]
        ranks.append([i for b in epochs[0] for i in b])
        assert (par.stats is None) == (workers == "processes")
    assert sorted(ranks[0] + ranks[1]) == sorted([*range(37), ranks[0][0]])
    it = iter(par)  # resume mid-epoch on the same persistent workers
    head = [next(it)[1].tolist() for _ in range(3)]
    par.load_state_dict(par.state_dict())
    assert head + _epoch(par) == _epoch(ref)


class _Failing(_Generic):
    def __getitems__(self, indices):
        raise ValueError(f"boom at {indices}")


def test_worker_error_surfaces():
    loader = DataLoader(_Failing(10), 2, num_workers=1)  # torch joins each worker 5 s
    with pytest.raises(ValueError, match="boom at"):
        list(loader)
    gc.collect()  # torch's worker shutdown (a 5 s join) happens here, not in a later test


class _Slow(H5Dataset):
    """Reading samples 20 and on takes 2 s."""

    def read_range(self, start, stop, **kwargs):
        if stop > 20:
            time.sleep(2)
        return super().read_range(start, stop, **kwargs)


def test_reading_threads_surface_errors_and_time_out(tmp_path):
    path = _make(tmp_path / "t.h5", 40)
    ds = H5Dataset(path, "x", label_key="y")
    loader = DataLoader(ds, 4, num_workers=2, buffer_bytes=0, shuffle=True)
    assert loader.stats is not None  # reading threads
    it = iter(loader)
    next(it)
    os.remove(path)
    with pytest.raises(FileNotFoundError, match="t.h5"):
        list(it)
    path = _make(tmp_path / "t.h5", 40)
    loader = DataLoader(_Slow(path, "x", label_key="y"), 4, num_workers=2, timeout=0.5)
    with pytest.raises(RuntimeError, match="timed out after 0.5 seconds"):
        list(loader)


def test_reading_threads_do_not_warn_of_worker_processes(files):
    ds = H5Dataset(files(37), "x", label_key="y")
    many = (os.cpu_count() or 1) + 2  # torch warns of more worker processes than CPUs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = DataLoader(ds, 4, num_workers=many, shuffle=True)
    assert loader.stats is not None and len(list(loader)) == 10  # reading threads
    with pytest.warns(UserWarning, match="worker processes"):
        DataLoader(ds, 4, num_workers=many, worker_init_fn=_init, shuffle=True)


def test_a_newer_iteration_stops_the_reading_threads_of_an_older_one(files):
    ds = H5Dataset(files(37), "x", label_key="y")
    ref = DataLoader(ds, 4, seed=2, buffer_bytes=10 * 24, shuffle=True)
    loader = DataLoader(ds, 4, seed=2, buffer_bytes=10 * 24, num_workers=2, shuffle=True)
    old = iter(loader)
    first = next(old)
    assert _equal(first, next(iter(ref)))
    again = list(loader)  # epoch 0 again: the abandoned iteration restarts it
    assert all(_equal(a, b) for a, b in zip(again, list(ref), strict=True))
    with pytest.raises(RuntimeError, match="newer iteration"):
        next(old)


# -- resume -----------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", ["h5", "generic"])
def test_resume(files, dataset):
    ds = H5Dataset(files(37), "x", label_key="y") if dataset == "h5" else _Generic(37)
    key = (lambda b: b[1].tolist()) if dataset == "h5" else (lambda b: b["i"].tolist())
    ref = DataLoader(ds, 4, seed=9, shuffle=True)
    _epoch(ref) if dataset == "h5" else list(ref)  # resume inside epoch 1
    full = [key(b) for b in ref]
    nxt = [key(b) for b in ref]
    loader = DataLoader(ds, 4, seed=9, shuffle=True)
    loader.set_epoch(1)
    it = iter(loader)
    head = [key(next(it)) for _ in range(3)]
    state = loader.state_dict()
    assert head == full[:3] and state["epoch"] == 1 and state["batches_done"] == 3
    resumed = DataLoader(ds, 4, seed=9, shuffle=True)
    resumed.load_state_dict(state)
    assert [key(b) for b in resumed] == full[3:]
    assert resumed.state_dict()["epoch"] == 2 and resumed.state_dict()["batches_done"] == 0
    assert [key(b) for b in resumed] == nxt
    with pytest.raises(ValueError, match="seed"):
        DataLoader(ds, 4, seed=8, shuffle=True).load_state_dict(state)


# -- the buffer -------------------------------------------------------------------------


def _rate(loader, epochs):
    before = dict(loader.stats)
    for _ in range(epochs):
        for _ in loader:
            pass
    after = loader.stats
    hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
    return hits / (hits + misses), after["chunk_bytes_read"] - before["chunk_bytes_read"]


def test_whole_dataset_buffer_hits(tmp_path):
    n = 400
    ds = H5Dataset(_make(tmp_path / "b.h5", n, chunk=16, features=32), "x")
    loader = DataLoader(ds, 8, buffer_bytes=n * ds.sample_nbytes, shuffle=True)
    _rate(loader, 1)
    rate, chunk_bytes = _rate(loader, 1)
    assert rate >= 0.99 and chunk_bytes == 0


def test_quarter_buffer(tmp_path):
    n = 800
    ds = H5Dataset(_make(tmp_path / "q.h5", n, chunk=16, features=32), "x")
    loader = DataLoader(ds, 8, buffer_bytes=n * ds.sample_nbytes // 4, seed=1, shuffle=True)
    _rate(loader, 1)
    rate, chunk_bytes = _rate(loader, 2)
    assert rate >= 0.95 * 0.25
    single = H5Dataset(ds.path, "x")  # per-sample reads of the same epochs
    for epoch in (1, 2):
        for i in loader.sampler.indices(epoch).tolist():
            single.read_range(i, i + 1)
    assert chunk_bytes < 0.5 * single.chunk_bytes_read


# -- arguments --------------------------------------------------------------------------


class _NoLen:
    def __getitem__(self, i):
        return i


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((list(range(4)), 0), {}, ValueError, "batch_size"),
        ((list(range(4)), True), {}, ValueError, "batch_size"),
        ((list(range(4)), 2.0), {}, ValueError, "batch_size"),
        ((list(range(4)),), {"buffer_bytes": -1}, ValueError, "buffer_bytes"),
        ((list(range(4)),), {"num_workers": -1}, ValueError, "num_workers"),
        ((list(range(4)),), {"read_threads": 0}, ValueError, "read_threads"),
        (([],), {}, ValueError, "empty"),
        ((_NoLen(),), {}, TypeError, "__len__"),
        ((list(range(4)),), {"world_size": 2, "rank": 2}, ValueError, "rank"),
    ],
)
def test_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        DataLoader(*args, **kwargs)


def test_bad_epoch_and_state():
    loader = DataLoader(list(range(4)), 2)
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="batches_done"):
        loader.load_state_dict({**state, "batches_done": 3})
    with pytest.raises(ValueError, match="lacks"):
        loader.load_state_dict({"epoch": 0})


def test_shard_defaults_from_torch_distributed(monkeypatch):
    import tensorpress.loaders.dataloader as module

    assert DataLoader(list(range(10)), 2).world_size == 1
    monkeypatch.setattr(module.dist, "is_available", lambda: True)
    monkeypatch.setattr(module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(module.dist, "get_world_size", lambda: 3)
    monkeypatch.setattr(module.dist, "get_rank", lambda: 2)
    loader = DataLoader(list(range(10)), 2, shuffle=False)
    assert (loader.world_size, loader.rank) == (3, 2)
    assert [b.tolist() for b in loader] == [[2, 5], [8, 1]]  # position 11 wraps to sample 1


def test_window_keeps_every_sample_once_and_clusters_chunks(tmp_path):
    """``window``: each epoch still visits every sample once, and a window's batches
    draw from few chunks (the plan's chunk size is the dataset's)."""
    path = tmp_path / "w.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(256, dtype=np.float32).reshape(256, 1), chunks=(8, 1))
    ds = H5Dataset(path, "x")
    loader = DataLoader(ds, batch_size=16, window=32, seed=1, shuffle=True)
    assert loader.window == 32 and loader.state_dict()["window"] == 32
    order = np.concatenate([b.reshape(-1).numpy() for b in loader]).astype(np.int64)
    assert np.array_equal(np.sort(order), np.arange(256))
    for w in range(0, 256, 32):  # each window of 32 samples holds exactly 4 chunks of 8
        assert len(np.unique(order[w : w + 32] // 8)) == 4


def test_fixed_shards_hit_every_access_after_the_first_epoch(tmp_path):
    n, world = 400, 2
    ds = H5Dataset(_make(tmp_path / "f.h5", n, chunk=16, features=32), "x", label_key="y")
    share = n // world * (ds.sample_nbytes + 8)  # data and int64 label of a rank's samples
    seen = []
    for rank in range(world):
        loader = DataLoader(
            ds,
            8,
            world_size=world,
            rank=rank,
            shard="fixed",
            buffer_bytes=share,
            shuffle=True,
        )
        epochs = []
        for _ in range(3):
            epochs.append(sorted(int(i) for _, y in loader for i in y))
        assert epochs[0] == epochs[1] == epochs[2]  # the same share every epoch
        rate, chunk_bytes = _rate(loader, 1)
        assert rate == 1.0 and chunk_bytes == 0
        assert loader.state_dict()["shard"] == "fixed"
        seen += epochs[0]
    assert sorted(seen) == list(range(n))  # disjoint and covering
    fresh = DataLoader(ds, 8, world_size=world, rank=0, buffer_bytes=share, shuffle=True)
    _rate(fresh, 1)
    rate, chunk_bytes = _rate(fresh, 1)  # DistributedSampler's split changes every epoch
    assert rate < 1.0 and chunk_bytes > 0


def test_partial_reads_read_only_the_missed_samples(tmp_path):
    n = 800
    path = _make(tmp_path / "p.h5", n, chunk=16, features=32)
    with h5py.File(path, "a") as f:  # the same samples behind a filter: whole chunks
        f.create_dataset("f", data=f["x"][...], chunks=(16, 32), shuffle=True)

    def run(partial: bool):
        ds = H5Dataset(path, "x" if partial else "f", label_key="y")
        assert ds.partial_reads == partial
        loader = DataLoader(ds, 8, buffer_bytes=n * ds.sample_nbytes // 8, seed=3, shuffle=True)
        batches = [[(x.numpy(), y.tolist()) for x, y in loader]]
        first = dict(loader.stats)
        batches.append([(x.numpy(), y.tolist()) for x, y in loader])
        stats = loader.stats
        hits, misses = stats["hits"] - first["hits"], stats["misses"] - first["misses"]
        return batches, stats, hits / (hits + misses)

    (partial_batches, partial, partial_rate), (whole_batches, whole, _) = run(True), run(False)
    for a, b in zip(partial_batches, whole_batches, strict=True):  # the same batches
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert ya == yb and np.array_equal(xa, xb)
    # every sample read is a missed one (32 float32), no chunk-mates; labels read once
    assert partial["bytes_read"] == partial["misses"] * 32 * 4 + n * 8
    assert partial["chunk_bytes_read"] < 0.5 * whole["chunk_bytes_read"]
    assert partial_rate >= 0.8 / 8  # epoch 2: Belady's on samples, about the buffer's share


def test_compressed_datasets_give_the_batches_of_their_data(tmp_path):
    """A dataset compressed losslessly by tensorpress gives the batches its data gives,
    every sample read (and decoded) once with no buffer."""
    from tensorpress.files import compress_file

    path = _make(tmp_path / "p.h5", 40)
    cpath = tmp_path / "c.h5"
    compress_file(path, cpath, {"abs": 0.0}, codec="block", chunk_bytes=64)
    ds = H5Dataset(cpath, "x", label_key="y")
    assert ds.compressed
    ref = [b for b in DataLoader(H5Dataset(path, "x", label_key="y"), 4, seed=3, shuffle=True)]
    loader = DataLoader(ds, 4, seed=3, buffer_bytes=0, shuffle=True)
    got = list(loader)
    assert len(got) == len(ref) and all(_equal(a, b) for a, b in zip(got, ref, strict=True))
    assert loader.stats["misses"] == 40 and loader.stats["hits"] == 0


# -- torch's roles: sampler, batch_sampler, the dataset protocol -------------------------


def test_unshuffled_by_default_as_torchs(files):
    ds = H5Dataset(files(10), "x", label_key="y")
    assert _epoch(DataLoader(ds, 4)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert _epoch(DataLoader(ds, 4)) == [b.tolist() for _, b in TorchDataLoader(ds, 4)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_plan_as_sampler_is_the_loaders_own_plan(files, workers):
    ds = H5Dataset(files(37), "x", label_key="y")
    kw = dict(seed=7, world_size=2, rank=1, chunk_samples=CHUNK, window=8)
    plan = ShufflePlan(37, **kw)
    own = DataLoader(ds, 4, shuffle=True, seed=7, world_size=2, rank=1, window=8)
    given = DataLoader(ds, 4, sampler=plan, num_workers=workers, buffer_bytes=8 * 24)
    assert given.sampler is plan and given.state_dict() == own.state_dict()
    assert _epoch(given) == _epoch(own) and plan.epoch == 1  # epochs advance in the plan
    plan.set_epoch(5)  # DistributedSampler style: the plan's epoch is the loader's
    own.set_epoch(5)
    assert given.epoch == 5 and _epoch(given) == _epoch(own)
    it = iter(given)
    head = [next(it)[1].tolist() for _ in range(2)]
    state = given.state_dict()
    resumed = DataLoader(ds, 4, sampler=ShufflePlan(37, **kw), num_workers=workers)
    resumed.load_state_dict(state)
    assert head + _epoch(resumed) == _epoch(DataLoader(ds, 4, sampler=plan_at(kw, 6)))
    assert {i for b in _epoch(resumed) for i in b} == set(plan.indices(7).tolist())


def plan_at(kw: dict, epoch: int) -> ShufflePlan:
    plan = ShufflePlan(37, **kw)
    plan.set_epoch(epoch)
    return plan


@pytest.mark.parametrize("dataset", ["h5", "generic"])
@pytest.mark.parametrize("workers", [0, 2])
def test_any_sampler_or_batch_sampler_gives_torchs_batches(files, dataset, workers):
    """A sampler that is no plan is drawn as torch draws it: every sample once per epoch,
    the batches of torch's loader; resuming skips the batches already done."""
    ds = H5Dataset(files(37), "x", label_key="y") if dataset == "h5" else _Generic(37)
    order = np.random.default_rng(1).permutation(37).tolist()
    lists = [order[i : i + 5] for i in range(0, 37, 5)]
    for kw in ({"batch_size": 5, "sampler": order}, {"batch_sampler": lists}):
        loader = DataLoader(ds, num_workers=workers, buffer_bytes=6 * 24, **kw)
        ref = TorchDataLoader(ds, **kw)
        for _ in range(2):
            got = list(loader)
            assert len(got) == len(loader) == 8
            assert all(_equal(a, b) for a, b in zip(got, ref, strict=True))
        assert loader.epoch == 2 and loader.state_dict()["seed"] is None
        it = iter(loader)
        next(it)
        next(it)
        resumed = DataLoader(ds, num_workers=workers, **kw)
        resumed.load_state_dict(loader.state_dict())
        rest = list(resumed)
        assert len(rest) == 6 and all(
            _equal(a, b) for a, b in zip(rest, list(ref)[2:], strict=True)
        )
    sampled = DataLoader(ds, 5, sampler=torch.utils.data.RandomSampler(ds))
    assert sorted(int(i) for b in sampled for i in _ids(b)) == list(range(37))


def _ids(batch) -> list[int]:
    return batch[1].tolist() if isinstance(batch, list) else batch["i"].tolist()


def test_set_epoch_reaches_a_distributed_sampler(files):
    ds = H5Dataset(files(37), "x", label_key="y")
    sampler = DistributedSampler(ds, num_replicas=2, rank=0, seed=3)
    loader = DataLoader(ds, 4, sampler=sampler)
    loader.set_epoch(3)
    assert sampler.epoch == 3
    assert [i for b in _epoch(loader) for i in b] == list(sampler)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shuffle": True, "sampler": [0, 1]}, "sampler option is mutually exclusive"),
        ({"batch_sampler": [[0]], "batch_size": 2}, "batch_sampler option is mutually"),
        ({"batch_sampler": [[0]], "shuffle": True}, "batch_sampler option is mutually"),
        ({"batch_sampler": [[0]], "sampler": [0]}, "batch_sampler option is mutually"),
        ({"batch_sampler": [[0]], "drop_last": True}, "batch_sampler option is mutually"),
        ({"sampler": [0, 1], "seed": 3}, "seed set up the loader's own ShufflePlan"),
        ({"batch_sampler": [[0]], "window": 4}, "window set up the loader's own"),
    ],
)
def test_torchs_exclusive_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataLoader(list(range(4)), **kwargs)
    if "seed" not in kwargs and "window" not in kwargs:  # torch says the same
        with pytest.raises(ValueError, match=match):
            TorchDataLoader(list(range(4)), **kwargs)


class _Chunks:
    """A dataset in memory that offers the chunked-read members (and is no H5Dataset):
    items are ``(2 * x, label)``; ``reads`` counts the samples read."""

    transform = staticmethod(lambda x: 2 * x)
    chunk_samples, partial_reads, compressed = 4, False, False
    sample_shape, dtype, label_shape, label_dtype = (FEATURES,), np.dtype("f4"), (), np.dtype("i8")

    def __init__(self, n):
        self.x, self.y, self.bytes_read = _values(n), np.arange(n), 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.transform(self.x[i]), self.y[i]

    @property
    def chunk_bytes_read(self):
        return self.bytes_read

    def read_range(self, start, stop, *, whole_chunks=True, out=None):
        self.bytes_read += (stop - start) * self.x[0].nbytes
        if out is None:
            return self.x[start:stop].copy()
        out[...] = self.x[start:stop]
        return out

    def labels_range(self, start, stop):
        return self.y[start:stop].copy()

    def will_read(self, ranges):
        pass


def test_the_fast_path_is_chosen_by_what_a_dataset_offers():
    ds = _Chunks(40)
    loader = DataLoader(ds, 4, shuffle=True, buffer_bytes=40 * (24 + 8))
    _same_as_torch(loader, ds)  # two epochs
    stats = loader.stats  # whole chunks read once, kept: every later access hits
    assert stats["hits"] + stats["misses"] == 80 and stats["hits"] >= 40
    assert stats["bytes_read"] == 40 * 24
    assert DataLoader(_Generic(40), 4).stats is None  # item by item


@pytest.mark.parametrize("workers", [1, 3])
def test_each_worker_foresees_exactly_its_batches(workers):
    """Batch ``b`` goes to worker ``(b - first) % workers``: its window knows the batch's
    positions and the next use of each access, and no other worker claims the batch."""
    plan = ShufflePlan(50, seed=2, epochs=3)
    bs, batches, first = 4, 13, 2
    order = plan.indices(1)
    for w in range(workers):
        ahead = Lookahead(plan, bs, batches, w, workers)
        ahead.start(1, first)
        mine = [b for b in range(first, batches) if (b - first) % workers == w]
        seq = np.concatenate([order[b * bs : (b + 1) * bs] for b in mine])
        seq = np.concatenate([seq, ahead.mine(2, 0)[0]])
        pos = 0
        for b in range(batches):
            indices = order[b * bs : (b + 1) * bs]
            rel = ahead.positions(b, indices)
            if b not in mine:
                assert rel is None
                continue
            assert rel.tolist() == list(range(pos, pos + indices.size))
            for t, nu in zip(rel.tolist(), ahead.next_after(rel).tolist(), strict=True):
                later = np.flatnonzero(seq[t + 1 :] == seq[t])
                assert nu == ahead.base + (t + 1 + later[0] if later.size else seq.size)
            pos += indices.size
