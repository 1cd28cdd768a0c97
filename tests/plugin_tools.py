"""Helpers of the compiled HDF5 plugin's tests: its build script (loaded by its path, as
setuptools loads it), running the sanitizer-built decoder, and the Python decoder's verdict
on the same bytes."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess

import numpy as np
import pytest
from tensorpress.formats import hdf5_filter

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
    from tensorpress.formats import read_header
    from tensorpress.formats.stream_header import chunk_crc, encode_index

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
