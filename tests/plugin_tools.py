"""Helpers of the compiled HDF5 plugin's tests: its build script (loaded by its path, as
setuptools loads it), running the sanitizer-built decoder, the Python decoder's verdict
on the same bytes, and the edits of sz payloads the hostile-stream tests make."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import random
import re
import struct
import subprocess
import sys

import h5py
import numpy as np
import pytest
from tensorpress.compress.zstd import zstd_compress, zstd_decompress
from tensorpress.formats import hdf5_filter, read_header
from tensorpress.formats.stream_header import chunk_crc, encode_index

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def plugin_build():
    """formats/hdf5_plugin/build.py as a module."""
    path = ROOT / "formats" / "hdf5_plugin" / "build.py"
    spec = importlib.util.spec_from_file_location("_tp_plugin_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def built(make, *args):
    """``make(*args)``'s result, or a skipped test where no C compiler is found."""
    build = plugin_build()
    try:
        return make(build, *args)
    except build.BuildError as exc:
        if "no C compiler" in str(exc):
            pytest.skip(f"the plugin needs a C compiler: {exc}")
        raise


def plugin_library(tmp_path_factory) -> pathlib.Path:
    """A folder holding the plugin built from the current sources."""
    return plugin_library_at(tmp_path_factory.mktemp("plugin"))


def plugin_library_at(out: pathlib.Path) -> pathlib.Path:
    """``out``, a folder holding the plugin built from the current sources."""
    built(lambda b: b.build_library(out))
    return out


def decode_driver(tmp_path_factory) -> pathlib.Path:
    """The sanitizer-built decoding driver (tp_decode), built from the current sources."""
    out = tmp_path_factory.mktemp("driver") / "tp_decode"
    return built(lambda b: b.build_driver(out))


def plugin_env(plugin_dir) -> dict:
    """This process's environment with no HDF5_ setting but HDF5_PLUGIN_PATH=``plugin_dir``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HDF5_")}
    env["HDF5_PLUGIN_PATH"] = str(plugin_dir)
    return env


#: h5py reading datasets into .npy files, in a process that never imports tensorpress
READ = """
import json, sys
import h5py, numpy as np
out = {}
with h5py.File(sys.argv[1], "r") as f:
    for k, name in enumerate(json.loads(sys.argv[2])):
        try:
            np.save(f"{sys.argv[3]}/{k}.npy", f[name][...])
            out[name] = "ok"
        except OSError as exc:
            out[name] = f"error: {exc}"
assert "tensorpress" not in sys.modules
print(json.dumps(out))
"""


def read_without_tensorpress(plugin_dir, path, names, tmp: pathlib.Path) -> dict:
    """{name: array} of the datasets ``names`` of ``path`` as h5py reads them through the
    plugin in ``plugin_dir``, in a process that never imports tensorpress."""
    argv = [sys.executable, "-c", READ, str(path), json.dumps(names), str(tmp)]
    env = plugin_env(plugin_dir)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    status = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == dict.fromkeys(names, "ok"), status
    return {n: np.load(tmp / f"{k}.npy") for k, n in enumerate(names)}


def assert_same_bytes(got: dict, want: dict) -> None:
    """Every array of ``want`` is in ``got`` with the same dtype and bytes."""
    for n, w in want.items():
        assert got[n].dtype == w.dtype and got[n].tobytes() == w.tobytes(), n


def special_field(shape, dtype, seed=0, specials=True) -> np.ndarray:
    """A smooth random field with, where large enough, NaN, +-Inf and a spike."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).cumsum(axis=-1) + 0.05 * rng.standard_normal(shape)
    x = x.astype(dtype)
    flat = x.reshape(-1)
    if specials and flat.size > 24:
        flat[[3, 11, 17]] = [np.nan, np.inf, 0.0]
        flat[-2] = -np.inf
        flat[20] = flat[19] + 300.0
    return x


def smooth_field(shape, dtype, seed, head=()) -> np.ndarray:
    """Normal noise summed along every axis, its first values set to ``head``."""
    x = np.random.default_rng(seed).standard_normal(shape)
    for ax in range(len(shape)):
        x = np.cumsum(x, axis=ax)
    x.reshape(-1)[: len(head)] = head
    return x.astype(dtype)


def c_decode(driver, tmp: pathlib.Path, stream: bytes, cd=None) -> bytes | None:
    """The sanitizer-built decoder's output for ``stream`` (as the filter with cd_values
    ``cd``, else the whole stream), or None where it refuses; fails the test on a crash or
    a sanitizer report."""
    src, out = tmp / "in.tp", tmp / "out.raw"
    src.write_bytes(stream)
    out.unlink(missing_ok=True)
    argv = [str(driver), str(src), str(out)]
    if cd is not None:
        argv.append(",".join(str(int(v)) for v in cd))
    env = dict(
        os.environ,
        ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
        UBSAN_OPTIONS="print_stacktrace=1",
    )
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    report = "Sanitizer" in done.stderr or "runtime error" in done.stderr
    assert done.returncode in (0, 1) and not report, (done.returncode, done.stderr[-3000:])
    return out.read_bytes() if done.returncode == 0 else None


def py_decode(stream: bytes, cd=None) -> bytes | None:
    """The Python decoder's output for the same call, or None where it refuses."""
    import tensorpress as tp

    try:
        if cd is not None:
            return hdf5_filter.decode_chunk(stream, list(cd)).tobytes()
        return np.ascontiguousarray(tp.decompress(stream)).tobytes()
    except (ValueError, TypeError, OverflowError, RecursionError):  # FormatError is one
        return None


def with_payload(blob: bytes, i: int, payload: bytes) -> bytes:
    """``blob`` with chunk ``i``'s payload replaced (same length), checksums made valid."""
    h = read_header(blob)
    crcs = list(h.crcs)
    crcs[i] = chunk_crc(payload, i, h.version)
    index = encode_index(h.lengths, crcs)
    at = h.payload_offset - len(index)
    o = h.offsets[i]
    return blob[:at] + index + blob[h.payload_offset : o] + payload + blob[o + len(payload) :]


def filter_cd(codec: str, dtype, chunks, **bound) -> list[int]:
    """The cd_values a dataset of ``dtype`` and ``chunks`` stores (set_local's layout)."""
    dtype = np.dtype(dtype)
    head = list(hdf5_filter.filter(codec=codec, **bound)["compression_opts"])
    return head + [dtype.itemsize, int(dtype.byteorder == ">"), len(chunks), *chunks]


def payload_mutants(stream: bytes, rng: random.Random, count: int, mode_bytes=()):
    """``count`` streams with one chunk's payload changed at a few bytes, checksums valid;
    with ``mode_bytes``, a tenth of them with the first byte set to one of those too."""
    h = read_header(stream)
    for _ in range(count):
        i = rng.randrange(h.nchunks)
        payload = bytearray(stream[h.offsets[i] : h.offsets[i] + h.lengths[i]])
        if mode_bytes and rng.random() < 0.1:
            payload[0] = rng.choice(mode_bytes)
        for _ in range(rng.choice((1, 1, 2, 4))):
            at = rng.randrange(len(payload))
            payload[at] = (
                rng.randrange(256) if rng.random() < 0.5 else payload[at] ^ (1 << rng.randrange(8))
            )
        yield with_payload(stream, i, bytes(payload))


def edits_agree(driver, tmp: pathlib.Path, stream: bytes, edits, cd=None) -> None:
    """For each (header edit, whether Python decodes it) of ``edits``: the edited stream
    (``stream_edits.rewrite_header``) decodes, or not, as said, and the same in C."""
    from stream_edits import rewrite_header

    for k, (edit, decodes) in enumerate(edits):
        bad = rewrite_header(stream, edit)
        want = py_decode(bad, cd)
        assert (want is not None) == decodes, k
        assert c_decode(driver, tmp, bad, cd) == want, k


def tally(driver, tmp: pathlib.Path, cases, excuse=None) -> tuple[int, int]:
    """(decoded, refused): for each (label, stream, cd) of ``cases`` the compiled decoder
    returns what the Python decoder does (or ``excuse(stream)`` is true)."""
    decoded = refused = 0
    for label, stream, cd in cases:
        want = py_decode(stream, cd)
        got = c_decode(driver, tmp, stream, cd)
        assert got == want or (excuse is not None and excuse(stream)), label
        decoded += want is not None
        refused += want is None
    return decoded, refused


# -- sz payloads: a chunk's body is the zstd frame's content --------------------------

#: where the side information's u64 length sits in a predicted payload's body (after the
#: predictor, flags, eb, alpha, beta and radius)
SIDE_AT = 30


def c_verdict(driver, tmp: pathlib.Path, stream: bytes) -> tuple[bytes | None, int]:
    """(the decoder's bytes or None, its refusal code or 0); fails on a sanitizer report."""
    src, out = tmp / "in.tp", tmp / "out.raw"
    src.write_bytes(stream)
    out.unlink(missing_ok=True)
    done = subprocess.run([str(driver), str(src), str(out)], capture_output=True, text=True)
    report = "Sanitizer" in done.stderr or "runtime error" in done.stderr
    assert done.returncode in (0, 1) and not report, done.stderr[-3000:]
    if done.returncode == 0:
        return out.read_bytes(), 0
    return None, int(re.search(r"refused \((-?\d+)\)", done.stderr).group(1))


def decodes_as_python(driver, tmp: pathlib.Path, stream: bytes) -> None:
    """The compiled decoder returns the bytes ``tp.decompress`` does."""
    import tensorpress as tp

    got, code = c_verdict(driver, tmp, stream)
    assert code == 0 and got == np.ascontiguousarray(tp.decompress(stream)).tobytes()


def refused_alike(driver, tmp: pathlib.Path, stream: bytes) -> None:
    """Both decoders refuse ``stream``."""
    assert py_decode(stream) is None
    got, code = c_verdict(driver, tmp, stream)
    assert got is None and code < 0


def predictors(stream: bytes) -> set[int]:
    """The predictor id of each chunk of a stream (its payload's first byte)."""
    h = read_header(stream)
    return {
        zstd_decompress(stream[o : o + n], 1 << 30)[0]
        for o, n in zip(h.offsets, h.lengths, strict=False)
    }


def chunk_predictors(dset) -> set[int]:
    """Predictor ids of every chunk of an sz filter dataset (each chunk one stream)."""
    ids = set()
    for i in range(dset.id.get_num_chunks()):
        info = dset.id.get_chunk_info(i)
        ids |= predictors(dset.id.read_direct_chunk(info.chunk_offset)[1])
    return ids


def write_coded_chunks(dset, x: np.ndarray, codec: dict, predictor: int) -> None:
    """Every chunk of ``dset`` (an sz filter dataset of ``x``) written as a stream coded
    with ``codec``, each of whose chunks ``predictor`` codes; edge chunks padded with the
    fill value (0). The filter's cd_values cannot name a predictor (``auto`` picks one per
    chunk): this is how a test makes a dataset of one predictor."""
    import tensorpress as tp

    chunks = dset.chunks
    for offset in np.ndindex(*(-(-s // c) for s, c in zip(x.shape, chunks, strict=True))):
        start = tuple(o * c for o, c in zip(offset, chunks, strict=True))
        part = x[tuple(slice(s, s + c) for s, c in zip(start, chunks, strict=True))]
        full = np.zeros(chunks, x.dtype.newbyteorder("<"))
        full[tuple(slice(0, n) for n in part.shape)] = part
        stream = tp.compress(full, codec=codec, chunk_bytes=full.nbytes)
        assert predictors(stream) == {predictor}
        dset.id.write_direct_chunk(start, stream, filter_mask=0)


def body(stream: bytes, i: int = 0) -> bytes:
    """Chunk ``i``'s payload, its zstd frame decoded."""
    h = read_header(stream)
    return zstd_decompress(stream[h.offsets[i] : h.offsets[i] + h.lengths[i]], 1 << 30)


def with_bodies(stream: bytes, bodies: dict) -> bytes:
    """``stream`` with chunk i's payload the zstd frame of ``bodies[i]`` (any length),
    the index and checksums made valid."""
    h = read_header(stream)
    payloads = [stream[o : o + n] for o, n in zip(h.offsets, h.lengths, strict=False)]
    for i, b in bodies.items():
        payloads[i] = zstd_compress(bytes(b), 1)
    crcs = [chunk_crc(p, i, h.version) for i, p in enumerate(payloads)]
    index = encode_index([len(p) for p in payloads], crcs)
    return stream[: h.payload_offset - len(index)] + index + b"".join(payloads)


def side_of(stream: bytes) -> bytes:
    """The side information of a one-chunk stream's payload."""
    b = body(stream)
    n = struct.unpack_from("<Q", b, SIDE_AT)[0]
    return b[SIDE_AT + 8 : SIDE_AT + 8 + n]


def with_side(stream: bytes, side: bytes) -> bytes:
    """``stream`` (one chunk) with its payload's side information replaced."""
    b = body(stream)
    n = struct.unpack_from("<Q", b, SIDE_AT)[0]
    new = b[:SIDE_AT] + struct.pack("<Q", len(side)) + side + b[SIDE_AT + 8 + n :]
    return with_bodies(stream, {0: new})


def body_mutants(stream: bytes, rng: random.Random, count: int):
    """Bodies of one-chunk sz ``stream`` with a few bits flipped, seven flips in ten in
    the body's head and side information (which predictors 11 and up carry)."""
    b = body(stream)
    side_end = SIDE_AT + 8 + struct.unpack_from("<Q", b, SIDE_AT)[0] if b[0] >= 11 else SIDE_AT
    for _ in range(count):
        m = bytearray(b)
        for _ in range(rng.choice((1, 2, 4))):
            at = rng.randrange(side_end) if rng.random() < 0.7 else rng.randrange(len(m))
            m[at] ^= 1 << rng.randrange(8)
        yield bytes(m)


def fuzz_bodies(driver, tmp: pathlib.Path, sources: dict, seed: int, count: int):
    """(decoded, refused) over ``count`` :func:`body_mutants` of each one-chunk stream of
    ``sources`` (name: stream): the compiled decoder returns what the Python one does."""
    rng = random.Random(seed)
    cases = (
        (name, with_bodies(stream, {0: m}), None)
        for name, stream in sources.items()
        for m in body_mutants(stream, rng, count)
    )
    return tally(driver, tmp, cases)


def read_one_predictor_alike(tmp: pathlib.Path, name: str, predictor: int) -> None:
    """Datasets of the sz filter whose chunks the predictor ``name`` (id ``predictor``)
    codes, at each dataset's bound (float16/32/64, big-endian, 2-d to 4-d, edge chunks):
    the in-process filter reads them within the bound, NaN and Inf where they were, and
    the compiled plugin reads the same bytes in a process that never imports tensorpress."""
    plugin_dir = plugin_library_at(tmp / "plugin")
    sets = {
        "f4": (special_field((40, 48, 30), "<f4", 1), (16, 48, 16), 1e-3),
        "f8_be": (special_field((33, 70), ">f8", 2), (16, 32), 1e-4),
        "f2": (special_field((50, 9, 12), "<f2", 3), (50, 9, 12), 1e-2),
        "f4_4d": (special_field((3, 10, 12, 20), "<f4", 4), (2, 10, 12, 16), 1e-3),
    }
    path = tmp / f"{name}.h5"
    with h5py.File(path, "w") as f:
        for key, (x, chunks, eb) in sets.items():
            d = f.create_dataset(
                key, shape=x.shape, dtype=x.dtype, chunks=chunks, **hdf5_filter.filter(abs=eb)
            )
            write_coded_chunks(d, x, {"id": "sz", "predictor": name, "abs": eb}, predictor)
    names = sorted(sets)
    with h5py.File(path) as f:
        want = {n: f[n][...] for n in names}
    for n in names:
        x, _, eb = sets[n]
        fin = np.isfinite(x)
        assert np.array_equal(np.isfinite(want[n]), fin)
        err = np.abs(want[n][fin].astype(np.float64) - x[fin].astype(np.float64))
        assert np.all(err <= eb), n
    assert_same_bytes(read_without_tensorpress(plugin_dir, path, names, tmp), want)
