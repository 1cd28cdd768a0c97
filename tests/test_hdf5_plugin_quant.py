"""The compiled plugin's `quant` codec: h5py in a process that never imports tensorpress
reads quant datasets (float16/32/64, both byte orders, 1-d to 4-d with partial edge
chunks) bit for bit as the Python decoder does, and h5dump prints them;
``h5repack -f UD=32100,0,5,2,5,0,0,0`` writes each chunk byte for byte as the in-process
filter does. The sanitizer-built driver encodes every parameter set to the Python
encoder's bytes, decodes every parameter set as Python does, and refuses what Python
refuses (crafted headers, CRC-valid payload mutants)."""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tensorpress as tp
from plugin_tools import (
    c_decode,
    decode_driver,
    edits_agree,
    filter_cd,
    payload_mutants,
    plugin_env,
    plugin_library,
    py_decode,
    smooth_field,
    tally,
)
from stream_edits import set_field as _set
from tensorpress.compress.quant import QuantCodec
from tensorpress.files import compress_file
from tensorpress.formats import hdf5_filter, read_header

#: (shape, chunks): 1-d to 4-d, partial edge chunks along every dimension, and one chunk
#: over 1 MiB, which the stream cuts in two
SHAPES = [
    ((1000,), (96,)),
    ((37, 29), (16, 8)),
    ((9, 11, 13), (4, 5, 6)),
    ((5, 6, 7, 9), (2, 4, 3, 4)),
    ((700, 500), (600, 500)),
]
DTYPES = ("<f2", ">f2", "<f4", ">f4", "<f8", ">f8")
#: the cd_values h5repack gives: quant (5) with no bound (0), as tp.hdf5.filter writes them
#: the first values of every test field: zeros of both signs and a constant pair
HEAD = (0.0, -0.0, 3.0, 3.0)
QUANT_UD = f"UD={hdf5_filter.FILTER_ID},0,5,2,5,0,0,0"


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    return plugin_library(tmp_path_factory)


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return decode_driver(tmp_path_factory)


def _cases():
    """(name, dtype, shape, chunks), float16 without the 1.4 MB array."""
    for k, (dtype, (shape, chunks)) in enumerate(itertools.product(DTYPES, SHAPES)):
        if not (dtype.endswith("f2") and shape[0] == 700):
            yield f"d{k}", dtype, shape, chunks


def _hostile(kind: str, n: int, rng) -> np.ndarray:
    """Values through every branch: NaN and infinities (raw chunks), huge and tiny
    magnitudes, constant groups (zero scale), signed zeros, smooth data."""
    if kind == "wild":
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-40, 40, n)
        for v, p in ((np.nan, 0.002), (np.inf, 0.002), (-0.0, 0.05), (5e-324, 0.03)):
            x[rng.random(n) < p] = v
        return x
    if kind == "constant":
        return np.repeat(rng.standard_normal(n // 16 + 1), 16)[:n]
    return np.cumsum(rng.standard_normal(n)) * 0.01


def filter_of(dset) -> list[int]:
    """The cd_values of ``dset``'s first filter."""
    return list(dset.id.get_create_plist().get_filter(0)[2])


def _write_filtered(path, data: dict) -> None:
    """The in-process filter's quant datasets of ``data`` ({name: (array, chunks)})."""
    with h5py.File(path, "w") as f:
        for name, (x, chunks) in data.items():
            f.create_dataset(name, data=x, chunks=chunks, **tp.hdf5.filter(codec="quant"))


READ = """
import sys
import h5py, numpy as np
with h5py.File(sys.argv[1]) as f:
    np.savez(sys.argv[2], **{name: f[name][...] for name in f})
assert "tensorpress" not in sys.modules
"""


def test_h5py_without_tensorpress_reads_quant_bit_for_bit(plugin_dir, tmp_path):
    path, out = tmp_path / "q.h5", tmp_path / "read.npz"
    data = {n: (smooth_field(s, d, k, head=HEAD), c) for k, (n, d, s, c) in enumerate(_cases())}
    _write_filtered(path, data)
    argv = [sys.executable, "-c", READ, str(path), str(out)]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=plugin_env(plugin_dir), timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.load(out)
    with h5py.File(path) as f:
        for name, dtype, shape, _ in _cases():
            want = f[name][...]  # the in-process (Python) filter
            assert got[name].dtype == np.dtype(dtype) and got[name].shape == shape
            assert got[name].tobytes() == want.tobytes(), name
            x = data[name][0].astype("f8")  # 4 bits: within a step of the group's range
            assert 0 < np.abs(want.astype("f8") - x).max() <= (x.max() - x.min()) / 15


def test_the_filter_layout_writes_quant_that_the_plugin_reads(plugin_dir, tmp_path):
    src, dst, out = tmp_path / "in.h5", tmp_path / "q.h5", tmp_path / "read.npz"
    with h5py.File(src, "w") as f:
        f.create_dataset("u", data=smooth_field((300, 200), ">f8", 1, head=HEAD), chunks=(64, 200))
        f.create_dataset(
            "g/v", data=smooth_field((50, 40, 30), "<f4", 2, head=HEAD), chunks=(10, 40, 30)
        )
    compress_file(src, dst, None, codec="quant", layout="filter")
    argv = [sys.executable, "-c", READ.replace("for name in f", "for name in ('u', 'g/v')")]
    done = subprocess.run(
        [*argv, str(dst), str(out)], capture_output=True, text=True, env=plugin_env(plugin_dir)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = np.load(out)
    with h5py.File(dst) as f:
        for name in ("u", "g/v"):
            assert hdf5_filter.parse_cd_values(filter_of(f[name]))["codec"] == "quant"
            assert got[name].tobytes() == f[name][...].tobytes()


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump not installed (hdf5-tools)")
def test_h5dump_prints_the_python_decoders_values(plugin_dir, tmp_path):
    path = tmp_path / "q.h5"
    data = {
        f"x{k}": (smooth_field((37, 29), d, k, head=HEAD), (16, 8)) for k, d in enumerate(DTYPES)
    }
    _write_filtered(path, data)
    with h5py.File(path) as f:
        for name in data:
            argv = ["h5dump", "-d", name, "-m", "%.17g", "-y", "-w", "0", "--noindex", str(path)]
            done = subprocess.run(
                argv, capture_output=True, text=True, env=plugin_env(plugin_dir), timeout=60
            )
            assert done.returncode == 0 and "DATA" in done.stdout, done.stderr[-2000:]
            body = done.stdout.split("DATA {", 1)[1]
            values = [float(v) for v in re.findall(r"-?[\d.]+(?:e[-+]?\d+)?", body)]
            assert np.array_equal(np.array(values), f[name][...].astype("f8").reshape(-1))


def _stored_chunks(dset):
    """(offset, stored bytes) of every chunk of ``dset``."""
    grid = [range(0, n, c) for n, c in zip(dset.shape, dset.chunks, strict=True)]
    for offset in np.stack(np.meshgrid(*grid, indexing="ij"), -1).reshape(-1, dset.ndim):
        yield tuple(int(o) for o in offset), dset.id.read_direct_chunk(tuple(offset))[1]


def _max_error(stream: bytes) -> float:
    """The largest max_error the chunks of a quant stream record."""
    h = read_header(stream)
    return max(
        QuantCodec.payload_max_error(stream[o : o + n])
        for o, n in zip(h.offsets, h.lengths, strict=True)
    )


@pytest.mark.skipif(shutil.which("h5repack") is None, reason="h5repack not installed (hdf5-tools)")
def test_h5repack_writes_quant_as_the_in_process_filter(plugin_dir, tmp_path):
    src, out, ref = tmp_path / "in.h5", tmp_path / "out.h5", tmp_path / "ref.h5"
    data = {n: (smooth_field(s, d, k, head=HEAD), c) for k, (n, d, s, c) in enumerate(_cases())}
    with h5py.File(src, "w") as f:
        for name, (x, chunks) in data.items():
            f.create_dataset(name, data=x, chunks=chunks)
    _write_filtered(ref, data)
    argv = ["h5repack", "-f", QUANT_UD, str(src), str(out)]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=plugin_env(plugin_dir), timeout=300
    )
    assert done.returncode == 0 and not done.stderr, done.stderr[-2000:]
    with h5py.File(out) as f, h5py.File(ref) as g:
        for name, (x, chunks) in data.items():
            dset = f[name]
            assert dset.dtype == x.dtype and dset.id.get_create_plist().get_filter(0)[0] == 32100
            for (offset, stored), (_, want) in zip(
                _stored_chunks(dset), _stored_chunks(g[name]), strict=True
            ):
                assert stored == want, (name, offset)
                # every value of the chunk within the max error its stream records
                at = tuple(slice(o, o + c) for o, c in zip(offset, chunks, strict=True))
                err = np.abs(dset[at].astype("f8") - x[at].astype("f8"))
                assert np.all(err <= _max_error(stored)), (name, offset)


WRITE = """
import sys
import h5py, numpy as np
x = np.linspace(-3, 3, 4000).reshape(40, 100).astype("f4")
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("x", data=x, chunks=(16, 64), compression=32100,
                     compression_opts=(2, 5, int(sys.argv[2]), 0, 0))
assert "tensorpress" not in sys.modules
"""


def test_h5py_without_tensorpress_writes_quant_and_a_bound_is_refused(plugin_dir, tmp_path):
    path = tmp_path / "w.h5"
    argv = [sys.executable, "-c", WRITE, str(path), "0"]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=plugin_env(plugin_dir), timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    x = np.linspace(-3, 3, 4000).reshape(40, 100).astype("f4")
    with h5py.File(path) as f:  # decoded in process: the Python filter reads C's bytes
        err = np.abs(f["x"][...] - x)
        assert 0 < err.max() <= 6 / 15 / 2 * 1.001  # 4 bits: half a step of the range
    argv[-1] = "1"  # an abs bound, which quant does not take
    done = subprocess.run(
        argv, capture_output=True, text=True, env=plugin_env(plugin_dir), timeout=120
    )
    assert done.returncode != 0 and "quant takes no error bound" in done.stderr


def _run_driver(driver, tmp_path, args: list[str], data: bytes) -> bytes | None:
    src, out = tmp_path / "in.raw", tmp_path / "out.bin"
    src.write_bytes(data)
    out.unlink(missing_ok=True)
    argv = [str(driver), args[0], str(src), str(out), *args[1:]]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1", UBSAN_OPTIONS="print_stacktrace=1")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    report = "Sanitizer" in done.stderr or "runtime error" in done.stderr
    assert done.returncode in (0, 1) and not report, done.stderr[-3000:]
    return out.read_bytes() if done.returncode == 0 else None


@pytest.mark.parametrize("kind", ["wild", "constant", "smooth"])
@pytest.mark.parametrize("dtype", ["<f2", ">f2", "<f4", ">f4", "<f8", ">f8"])
def test_the_driver_encodes_chunks_as_the_python_filter(driver, tmp_path, kind, dtype):
    rng = np.random.default_rng(sum(map(ord, kind + dtype)))
    for shape in ((1,), (63,), (30, 65), (3, 4, 5, 70), (1100, 130)):
        with np.errstate(over="ignore"):
            x = _hostile(kind, int(np.prod(shape)), rng).astype(dtype).reshape(shape)
        cd = filter_cd("quant", dtype, shape)
        want = bytes(hdf5_filter.encode_chunk(x.tobytes(), cd))
        assert _run_driver(driver, tmp_path, ["-e", ",".join(map(str, cd))], x.tobytes()) == want
        assert c_decode(driver, tmp_path, want, cd) == py_decode(want, cd) is not None


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8"])
def test_every_parameter_set_encodes_and_decodes_as_python(driver, tmp_path, dtype):
    """bits, group, stochastic (keyed on the offset), seed and hadamard: the payload the
    C encoder writes, and the values the C decoder reads from Python's stream."""
    rng = np.random.default_rng(int(dtype[-1]))
    for bits, group, stochastic, hadamard in itertools.product(
        (2, 4, 8), (16, 128), (False, True), (False, True)
    ):
        n = int(rng.integers(1, 700))
        with np.errstate(over="ignore"):
            x = _hostile(rng.choice(["wild", "smooth"]), n, rng).astype(dtype)
        codec = QuantCodec(bits, group, stochastic, seed=2**31 - 5, hadamard=hadamard)
        params = f"{bits},{group},{int(stochastic)},{2**31 - 5},{int(hadamard)},{x.itemsize},77"
        got = _run_driver(driver, tmp_path, ["-q", params], x.tobytes())
        assert got == codec.encode(x, offset=77), (bits, group, stochastic, hadamard)
        stream = tp.compress(x.reshape(-1, 7) if n % 7 == 0 else x, codec=codec, chunk_bytes=512)
        assert c_decode(driver, tmp_path, stream) == py_decode(stream) is not None


@pytest.fixture(scope="module")
def quant_chunks():
    """(stream, cd_values) of filter chunks, and Hadamard streams of several chunks."""
    x = np.random.default_rng(5).standard_normal((40, 30)).cumsum(0)
    out = {}
    for dtype in ("<f2", ">f4", "<f8"):
        cd = filter_cd("quant", dtype, x.shape)
        out[dtype] = (bytes(hdf5_filter.encode_chunk(x.astype(dtype).tobytes(), cd)), cd)
    for bits in (2, 8):
        codec = QuantCodec(bits, 32, hadamard=True, seed=9)
        stream = tp.compress(x.astype("f4"), codec=codec, chunk_bytes=1024)
        assert read_header(stream).nchunks > 1
        out[f"hadamard{bits}"] = (stream, None)
    return out


def _quant(**params):
    def edit(h):
        h["codec"] = {"id": "quant", **params}

    return edit


#: quant header edits (checksums valid) with whether Python decodes the result
QUANT_EDITS = [
    (_quant(bits=4, group=128, stochastic=True, seed=3, hadamard=False), True),
    (_quant(), True),
    (_quant(bits=2), False),  # decodes with another layout: the payload's length differs
    (_quant(bits=3), False),
    (_quant(bits=4.0), False),
    (_quant(bits=True), False),
    (_quant(group=100), False),
    (_quant(group=8), False),
    (_quant(group=8192), False),
    (_quant(seed=-1), False),
    (_quant(seed=2**31), False),
    (_quant(seed=2**31 - 1), True),
    (_quant(stochastic=1), False),
    (_quant(hadamard=None), False),
    (_quant(abs=1e-3), False),
    (_quant(abs=None), True),
    (_quant(stages="zstd"), False),
    (_quant(radius=2), False),
    (_set("bound", {"mode": "abs", "value": 1.0, "tolerance": 1.0}), False),
    (_set("dtype", "<f8"), False),
    (_set("dtype", "bfloat16"), False),
]


def test_quant_header_edits_agree_with_python(driver, tmp_path, quant_chunks):
    stream, cd = quant_chunks[">f4"]
    edits_agree(driver, tmp_path, stream, QUANT_EDITS, cd)
    for lie in ([2, 2, 1, *cd[3:]], [2, 5, 1, *cd[3:]], [2, 6, 0, *cd[3:]]):  # block, a bound
        assert c_decode(driver, tmp_path, stream, lie) is None is py_decode(stream, lie)


def _agree(driver, tmp_path, chunks: dict, seed: int, per_chunk: int) -> tuple[int, int]:
    rng = random.Random(seed)
    cases = (
        ((name, seed), bad, cd)
        for name, (stream, cd) in chunks.items()
        for bad in payload_mutants(stream, rng, per_chunk, mode_bytes=(1, 2, 255))
    )
    return tally(driver, tmp_path, cases)


def _with_length(stream: bytes, payload: bytes) -> bytes:
    """One-chunk ``stream`` with its payload replaced by ``payload`` of any length, the
    index and checksums made valid."""
    from tensorpress.formats.stream_header import chunk_crc, encode_index

    h = read_header(stream)
    assert h.nchunks == 1
    at = h.payload_offset - len(encode_index(h.lengths, h.crcs))
    return stream[:at] + encode_index([len(payload)], [chunk_crc(payload, 0, h.version)]) + payload


def test_payload_mutants_and_lengths_agree_with_python(driver, tmp_path, quant_chunks):
    decoded, refused = _agree(driver, tmp_path, quant_chunks, seed=1, per_chunk=12)
    assert decoded and refused  # both outcomes were exercised
    stream, cd = quant_chunks["<f8"]
    payload = stream[read_header(stream).offsets[0] :]
    values = np.random.default_rng(1).standard_normal(40 * 30).tobytes()
    for cut in (b"", payload[:1], payload[:9], payload[:-1], payload + b"\0", b"\1" + values[1:]):
        bad = _with_length(stream, cut)
        assert c_decode(driver, tmp_path, bad, cd) is None is py_decode(bad, cd)
    raw = _with_length(stream, b"\1" + values)  # mode 1: the values as they are
    assert c_decode(driver, tmp_path, raw, cd) == py_decode(raw, cd) == values


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_fuzz_quant_mutants(driver, tmp_path, quant_chunks, seed):
    """Seeded mutation fuzzing of quant payloads, CRC-valid: same values or refusal."""
    _agree(driver, tmp_path, quant_chunks, seed=200 + seed, per_chunk=80)
