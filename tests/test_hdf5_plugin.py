"""The compiled HDF5 plugin (formats/hdf5_plugin/) read by programs that never import
tensorpress: h5py in a subprocess with only HDF5_PLUGIN_PATH set gets the in-process
filter's values bit for bit and h5dump prints them (its `block` encoder:
test_hdf5_plugin_encoder.py; `sz`, and the read error of a chunk whose predictor it does
not decode yet: test_hdf5_plugin_sz.py)."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tensorpress as tp
from plugin_tools import built, plugin_env, plugin_library, smooth_field
from tensorpress.cli import main
from tensorpress.formats import hdf5_plugin_path

#: reads datasets of a file through the plugin alone and saves each as .npy (or the
#: error it raised); tensorpress must not be imported
READ = """
import json, sys
import h5py, numpy as np
out = {}
with h5py.File(sys.argv[1], "r") as f:
    for k, name in enumerate(json.loads(sys.argv[2])):
        try:
            values = f[name][...]
            np.save(f"{sys.argv[3]}/{k}.npy", values)
            out[name] = "ok"
        except OSError as exc:
            out[name] = f"error: {exc}"
assert "tensorpress" not in sys.modules
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    return plugin_library(tmp_path_factory)


def read_with_plugin(path, names, plugin_dir, tmp_path) -> dict:
    """{name: array or error text} of ``names`` read by h5py through the plugin only."""
    env = plugin_env(plugin_dir)
    argv = [sys.executable, "-c", READ, str(path), json.dumps(names), str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    status = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        n: np.load(tmp_path / f"{k}.npy") if status[n] == "ok" else status[n]
        for k, n in enumerate(names)
    }


def test_the_library_exports_filter_32100_with_an_encoder_and_a_decoder(plugin_dir):
    lib = ctypes.CDLL(str(plugin_dir / hdf5_plugin_path.LIBRARY))
    lib.H5PLget_plugin_info.restype = ctypes.c_void_p
    assert lib.H5PLget_plugin_type() == 0  # H5PL_TYPE_FILTER
    info = lib.H5PLget_plugin_info()
    version, fid, encoder, decoder = (ctypes.c_int * 4).from_address(info)
    name = ctypes.c_char_p.from_address(info + 16).value.decode()
    assert (version, fid, encoder, decoder) == (1, tp.hdf5.FILTER_ID, 1, 1)
    assert name.startswith("tensorpress") and "compiled plugin" in name


def test_plugin_path_names_the_installed_library(capsys):
    if hdf5_plugin_path.plugin_library() is None:
        pytest.skip("tensorpress was installed without a C compiler: no plugin was built")
    assert tp.hdf5.PLUGIN_PATH == hdf5_plugin_path.PLUGIN_PATH
    assert main(["plugin-path"]) == 0
    assert capsys.readouterr().out.strip() == tp.hdf5.PLUGIN_PATH


def test_plugin_path_says_when_the_plugin_was_not_built(monkeypatch, capsys):
    monkeypatch.setattr(hdf5_plugin_path, "LIBRARY", "libh5tensorpress-absent.so")
    assert main(["plugin-path"]) == 2
    err = capsys.readouterr().err
    assert "not built" in err and "C compiler" in err and len(err.strip().splitlines()) == 1


#: (shape, chunks): 1-d to 4-d, with partial edge chunks along every dimension
SHAPES = [
    ((1000,), (96,)),
    ((37, 29), (16, 8)),
    ((9, 11, 13), (4, 5, 6)),
    ((5, 6, 7, 9), (2, 4, 3, 4)),
]
CASES = [
    (codec, bound, dtype, shape, chunks)
    for codec, bound, dtypes in (
        ("zstd", {}, ("<f2", "<f4", "<f8", ">f4", ">f8")),
        ("block", {"abs": 1e-2}, ("<f2", "<f4", "<f8", ">f2", ">f8")),
        ("block", {"pw_rel": 1e-3}, ("<f4", ">f8")),
        ("int8", {"abs": 0.05}, ("<f4", "<f8", ">f4")),
        ("sz", {"abs": 1e-2}, ("<f2", "<f4", "<f8", ">f4", ">f8")),
        ("sz", {"pw_rel": 1e-3}, ("<f4", ">f8")),
    )
    for dtype in dtypes
    for shape, chunks in SHAPES
]


@pytest.fixture(scope="module")
def filtered_file(tmp_path_factory):
    """A file of every case, written through the in-process filter, and what it reads."""
    path = tmp_path_factory.mktemp("filtered") / "cases.h5"
    expected = {}
    with h5py.File(path, "w") as f:
        for k, (codec, bound, dtype, shape, chunks) in enumerate(CASES):
            x = smooth_field(shape, dtype, k)
            name = f"c{k}"
            f.create_dataset(name, data=x, chunks=chunks, **tp.hdf5.filter(codec=codec, **bound))
            expected[name] = (f[name][...], x)
    return path, expected


def test_h5py_without_tensorpress_reads_every_codec_bit_for_bit(
    filtered_file, plugin_dir, tmp_path
):
    path, expected = filtered_file
    got = read_with_plugin(path, sorted(expected), plugin_dir, tmp_path)
    for name, (want, original) in expected.items():
        codec, bound, dtype, *_ = CASES[int(name[1:])]
        assert isinstance(got[name], np.ndarray), (CASES[int(name[1:])], got[name])
        assert got[name].dtype == np.dtype(dtype) and got[name].shape == original.shape
        assert got[name].tobytes() == want.tobytes(), CASES[int(name[1:])]
        err = np.abs(got[name].astype(np.float64) - original.astype(np.float64))
        tol = bound.get("abs", 0.0) + bound.get("pw_rel", 0.0) * np.abs(original.astype(np.float64))
        assert np.all(err <= tol), CASES[int(name[1:])]


def test_a_file_the_cli_compressed_reads_through_the_plugin(plugin_dir, tmp_path):
    src, out = tmp_path / "in.h5", tmp_path / "out.h5"
    with h5py.File(src, "w") as f:
        f["grid/t"] = smooth_field((40, 30, 7), "<f4", 1)
        f["u"] = smooth_field((300,), ">f8", 2)
    argv = [str(src), str(out), "--layout", "filter", "--codec", "block", "--abs", "1e-3"]
    assert main(["compress", *argv]) == 0
    with h5py.File(out) as f:
        want = {"grid/t": f["grid/t"][...], "u": f["u"][...]}
    got = read_with_plugin(out, sorted(want), plugin_dir, tmp_path)
    for name, values in want.items():
        assert got[name].dtype == values.dtype and got[name].tobytes() == values.tobytes()


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump not installed (hdf5-tools)")
def test_h5dump_prints_the_values(filtered_file, plugin_dir):
    path, expected = filtered_file
    env = plugin_env(plugin_dir)
    for k in (0, 25, 41, len(CASES) - 1):  # zstd, block, block pw_rel, int8
        name = f"c{k}"
        want = expected[name][0]
        fmt = "%.17g" if want.dtype.itemsize == 8 else "%.9g"
        argv = ["h5dump", "-d", f"/{name}", "-m", fmt, "-w", "0", str(path)]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        data = re.sub(r"\([\d,]+\):", " ", done.stdout.split("DATA {", 1)[1].split("}")[0])
        values = [float(v) for v in data.replace(",", " ").split()]
        assert np.array_equal(np.array(values, want.dtype), want.reshape(-1)), name


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump not installed (hdf5-tools)")
def test_h5dump_without_the_plugin_prints_no_values(filtered_file):
    env = plugin_env("/nonexistent")
    path, _ = filtered_file
    argv = ["h5dump", "-d", "/c0", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0 and "unable to print data" in done.stderr
    assert not re.search(r"\(0\):", done.stdout)  # the control for the test above


def test_a_build_without_a_compiler_says_so(monkeypatch, tmp_path):
    build = built(lambda b: b)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(build.sysconfig, "get_config_var", lambda name: None)
    with pytest.raises(build.BuildError, match="no C compiler"):
        build.build_library(tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_importing_tensorpress_replaces_the_plugin_with_the_filter_that_writes(plugin_dir):
    """With the plugin in HDF5_PLUGIN_PATH (HDF5 loads it when tensorpress asks whether
    the id is taken), the in-process filter, which also writes and decodes sz, takes the
    id in that process."""
    script = (
        "import h5py, numpy as np, tensorpress as tp, warnings\n"
        "assert tp.hdf5.unavailable is None, tp.hdf5.unavailable\n"
        "x = np.random.default_rng(0).standard_normal((64, 64)).astype('f4')\n"
        "with h5py.File(__import__('sys').argv[1], 'w') as f:\n"
        "    f.create_dataset('s', data=x, chunks=(32, 32), **tp.hdf5.filter(abs=1e-3))\n"
        "    assert np.abs(f['s'][...] - x).max() <= 1e-3\n"
        "    assert f['s'].id.get_create_plist().get_filter(0)[3] == tp.hdf5.NAME\n"
    )
    env = plugin_env(plugin_dir)
    path = plugin_dir.parent / "written_here.h5"
    argv = [sys.executable, "-W", "error::RuntimeWarning", "-c", script, str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


#: reads each chunk row of dataset "u" on its own, counting the failures
READ_ROWS = """
import sys
import h5py
failed = 0
with h5py.File(sys.argv[1], "r") as f:
    for i in range(0, f["u"].shape[0], 4):
        try:
            f["u"][i : i + 4]
        except OSError:
            failed += 1
assert "tensorpress" not in sys.modules
print(failed)
"""


@pytest.fixture(scope="module")
def damaged_file(tmp_path_factory):
    """A block dataset of 16 chunks, every stored chunk with one byte flipped."""
    path = tmp_path_factory.mktemp("damaged") / "bad.h5"
    x = np.cumsum(np.random.default_rng(0).standard_normal((64, 100)), 1).astype(np.float32)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("u", data=x, chunks=(4, 100), **tp.hdf5.filter(abs=1e-3))
        spans = [d.id.get_chunk_info(i) for i in range(d.id.get_num_chunks())]
    with open(path, "r+b") as fh:
        for c in spans:  # a byte of the last payload: the chunk's checksum catches it
            fh.seek(c.byte_offset + c.size - 3)
            b = fh.read(1)[0]
            fh.seek(c.byte_offset + c.size - 3)
            fh.write(bytes([b ^ 0x55]))
    return path


def _plugin_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("tensorpress HDF5 plugin")]


@pytest.mark.parametrize("debug", [False, True])
def test_a_damaged_file_says_why_once_not_per_chunk(damaged_file, plugin_dir, debug):
    """16 failing reads: one line with the reason, unless TENSORPRESS_PLUGIN_DEBUG asks
    for each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HDF5_", "TENSORPRESS_"))}
    env["HDF5_PLUGIN_PATH"] = str(plugin_dir)
    if debug:
        env["TENSORPRESS_PLUGIN_DEBUG"] = "1"
    argv = [sys.executable, "-c", READ_ROWS, str(damaged_file)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["16"], done.stderr[-2000:]
    lines = _plugin_lines(done.stderr)
    assert len(lines) == (16 if debug else 1), done.stderr[-2000:]
    assert all("cannot decode a chunk: chunk 0 checksum mismatch" in line for line in lines)
    assert debug or "TENSORPRESS_PLUGIN_DEBUG=1 prints each" in lines[0]


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump not installed (hdf5-tools)")
def test_h5dump_of_a_damaged_file_prints_one_reason(damaged_file, plugin_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HDF5_", "TENSORPRESS_"))}
    env["HDF5_PLUGIN_PATH"] = str(plugin_dir)
    argv = ["h5dump", "-d", "/u", str(damaged_file)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0
    assert len(_plugin_lines(done.stderr)) == 1, done.stderr
    assert len(done.stderr.splitlines()) <= 3, done.stderr  # its own "unable to print data"
