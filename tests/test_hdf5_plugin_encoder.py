"""The compiled plugin's `block` encoder: ``h5repack -f UD=32100,...`` writes datasets
that tensorpress reads within the bound, each stored chunk byte for byte what the
in-process filter stores; h5py without tensorpress writes them too, and a codec the
plugin does not write fails the dataset's creation with the reason. The sanitizer-built
driver encodes random arrays (NaN, infinities, subnormals, constants, signed zeros) to
the Python encoder's bytes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tensorpress as tp
from plugin_tools import decode_driver, filter_cd, plugin_env, plugin_library, smooth_field
from tensorpress.formats import hdf5_filter

#: (shape, chunks): 1-d to 4-d, partial edge chunks along every dimension, and one chunk
#: over 1 MiB, which the stream cuts in two
SHAPES = [
    ((1000,), (96,)),
    ((37, 29), (16, 8)),
    ((9, 11, 13), (4, 5, 6)),
    ((5, 6, 7, 9), (2, 4, 3, 4)),
    ((700, 500), (600, 500)),
]
DTYPES = ("<f4", ">f4", "<f8", ">f8", "<f2")
#: the first values of every test field: zeros of both signs, a subnormal, a constant pair
HEAD = (0.0, -0.0, 1e-300, 3.0, 3.0)
BOUNDS = ({"abs": 1e-3}, {"pw_rel": 1e-2})


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    return plugin_library(tmp_path_factory)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return decode_driver(tmp_path_factory)


def _cases():
    for k, (dtype, (shape, chunks)) in enumerate(
        (d, s) for d in DTYPES for s in SHAPES if not (d == "<f2" and s[0][0] == 700)
    ):
        yield f"d{k}", dtype, shape, chunks


def _chunks(dset):
    """(offset, stored bytes) of every chunk of ``dset``."""
    grid = [range(0, n, c) for n, c in zip(dset.shape, dset.chunks, strict=True)]
    for offset in np.stack(np.meshgrid(*grid, indexing="ij"), -1).reshape(-1, dset.ndim):
        yield tuple(int(o) for o in offset), dset.id.read_direct_chunk(tuple(offset))[1]


@pytest.mark.skipif(shutil.which("h5repack") is None, reason="h5repack not installed (hdf5-tools)")
@pytest.mark.parametrize("bound", BOUNDS, ids=lambda b: next(iter(b)))
def test_h5repack_writes_what_the_in_process_filter_writes(plugin_dir, tmp_path, bound):
    src, out, ref = tmp_path / "in.h5", tmp_path / "out.h5", tmp_path / "ref.h5"
    data = {
        name: smooth_field(shape, dtype, k, head=HEAD)
        for k, (name, dtype, shape, _) in enumerate(_cases())
    }
    opts = tp.hdf5.filter(codec="block", **bound)
    with h5py.File(src, "w") as f, h5py.File(ref, "w") as g:
        for name, _, _, chunks in _cases():
            f.create_dataset(name, data=data[name], chunks=chunks)
            g.create_dataset(name, data=data[name], chunks=chunks, **opts)
    ud = ",".join(map(str, (tp.hdf5.FILTER_ID, 0, 5, *opts["compression_opts"])))
    done = subprocess.run(
        ["h5repack", "-f", f"UD={ud}", str(src), str(out)],
        capture_output=True,
        text=True,
        env=plugin_env(plugin_dir),
        timeout=300,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr[-2000:]
    with h5py.File(out) as f, h5py.File(ref) as g:
        for name, dtype, shape, _ in _cases():
            dset = f[name]
            assert dset.dtype == np.dtype(dtype) and dset.shape == shape
            assert dset.id.get_create_plist().get_filter(0)[0] == tp.hdf5.FILTER_ID
            x = data[name].astype(np.float64)
            err = np.abs(dset[...].astype(np.float64) - x)
            assert np.all(err <= bound.get("abs", 0.0) + bound.get("pw_rel", 0.0) * np.abs(x))
            for (offset, stored), (_, want) in zip(_chunks(dset), _chunks(g[name]), strict=True):
                assert stored == want, (name, offset)
    with tp.open(out) as t:
        name = next(_cases())[0]
        assert np.array_equal(np.asarray(t[name][...]), h5py.File(ref)[name][...])


WRITE = """
import sys
import h5py, numpy as np
x = np.linspace(-3, 3, 4000).reshape(40, 100).astype("f4")
opts = tuple(int(v) for v in sys.argv[2].split(","))
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("x", data=x, chunks=(16, 64), compression=32100, compression_opts=opts)
assert "tensorpress" not in sys.modules
"""


def test_h5py_without_tensorpress_writes_block(plugin_dir, tmp_path):
    path = tmp_path / "w.h5"
    opts = tp.hdf5.filter(codec="block", abs=1e-4)["compression_opts"]
    argv = [sys.executable, "-c", WRITE, str(path), ",".join(map(str, opts))]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=plugin_env(plugin_dir), timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    x = np.linspace(-3, 3, 4000).reshape(40, 100).astype("f4")
    with h5py.File(path) as f:
        assert np.abs(f["x"][...] - x).max() <= 1e-4


@pytest.mark.parametrize("codec", ["sz", "int8", "zstd"])
def test_a_codec_the_plugin_does_not_write_fails_the_write_and_says_why(
    plugin_dir, tmp_path, codec
):
    bound = {} if codec == "zstd" else {"abs": 1e-3}
    opts = tp.hdf5.filter(codec=codec, **bound)["compression_opts"]
    argv = [sys.executable, "-c", WRITE, str(tmp_path / "w.h5"), ",".join(map(str, opts))]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=plugin_env(plugin_dir), timeout=120
    )
    assert done.returncode != 0
    assert "writes only the block codec" in done.stderr and "tensorpress imported" in done.stderr


def _encode(driver, tmp_path, x: np.ndarray, cd) -> bytes | None:
    src, out = tmp_path / "in.raw", tmp_path / "out.tp"
    src.write_bytes(x.tobytes())
    out.unlink(missing_ok=True)
    argv = [str(driver), "-e", str(src), str(out), ",".join(map(str, cd))]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    report = "Sanitizer" in done.stderr or "runtime error" in done.stderr
    assert done.returncode in (0, 1) and not report, done.stderr[-3000:]
    return out.read_bytes() if done.returncode == 0 else None


def _hostile(kind: str, n: int, rng) -> np.ndarray:
    """Values that exercise every branch of the encoder: raw and constant blocks, signed
    zeros under a zero bound, codes at the quantizer's limit, sparse blocks."""
    if kind == "wild":
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-45, 45, n)
        for v, p in ((np.nan, 0.01), (np.inf, 0.01), (-np.inf, 0.01), (-0.0, 0.05), (5e-324, 0.03)):
            x[rng.random(n) < p] = v
        return x
    if kind == "constant":
        return np.repeat(rng.standard_normal(n // 64 + 1), 64)[:n]
    if kind == "sparse":
        return np.where(rng.random(n) < 0.04, rng.standard_normal(n), 0.0)
    return np.cumsum(rng.standard_normal(n)) * 0.01


@pytest.mark.parametrize("kind", ["wild", "constant", "sparse", "smooth"])
@pytest.mark.parametrize("dtype", ["<f2", "<f4", ">f4", "<f8", ">f8"])
def test_the_driver_encodes_the_python_encoders_bytes(driver, tmp_path, kind, dtype):
    rng = np.random.default_rng(abs(hash((kind, dtype))) % 2**32)
    bounds = ({"abs": 1e-3}, {"abs": 0.0}, {"abs": 7.5}, {"pw_rel": 1e-3}, {"pw_rel": 0.0})
    for shape in ((1,), (63,), (30, 65), (3, 4, 5, 70)):
        with np.errstate(over="ignore"):
            x = _hostile(kind, int(np.prod(shape)), rng).astype(dtype).reshape(shape)
        for bound in bounds:
            cd = filter_cd("block", dtype, shape, **bound)
            want = bytes(hdf5_filter.encode_chunk(x.tobytes(), cd))
            assert _encode(driver, tmp_path, x, cd) == want, (shape, bound)


def test_the_driver_refuses_what_it_cannot_encode(driver, tmp_path):
    x = np.ones((4, 4), "<f4")
    cd = filter_cd("block", "<f4", (4, 4), abs=1e-3)
    assert _encode(driver, tmp_path, x[:3], cd) is None  # fewer bytes than the chunk
    assert _encode(driver, tmp_path, x, filter_cd("sz", "<f4", (4, 4), abs=1e-3)) is None
    assert _encode(driver, tmp_path, x, cd[:5]) is None  # no chunk layout
