"""Golden streams of every released format version keep decoding, bit for bit (``sz``
under a ``pw_rel`` bound: within the bound, see :func:`assert_decodes_as_written`)."""

import contextlib
import hashlib
import json
import pathlib

import numpy as np
import pytest
import tensorpress as tp
from tensorpress.formats import read_header
from tensorpress.formats.stream_header import FORMAT_VERSION

DATA = pathlib.Path(__file__).parent / "data"
#: one folder of golden streams per format version (v1, v2, ...), each with its manifest
VERSION_DIRS = sorted(d for d in DATA.glob("v*") if d.is_dir())
CASES = [
    (version_dir, name, meta)
    for version_dir in VERSION_DIRS
    for name, meta in json.loads((version_dir / "manifest.json").read_text()).items()
]


def test_golden_files_exist():
    assert len(CASES) >= 10


@pytest.mark.parametrize("version_dir", VERSION_DIRS, ids=lambda d: d.name)
def test_every_golden_stream_on_disk_is_in_its_manifest(version_dir):
    """A stream the manifest lacks would never be checked (sz_f32_md_cubic_3d was written
    with its predictor but left out of the manifest until this test)."""
    listed = set(json.loads((version_dir / "manifest.json").read_text()))
    assert {p.stem for p in version_dir.glob("*.tp")} == listed


@pytest.mark.parametrize(
    ("version_dir", "name", "meta"), CASES, ids=[f"{v.name}-{n}" for v, n, _ in CASES]
)
def test_golden_decodes(version_dir, name, meta):
    blob = (version_dir / f"{name}.tp").read_bytes()
    y = tp.decompress(blob)
    assert str(y.dtype) == meta["dtype"]
    assert list(y.shape) == meta["shape"]
    assert ("F" if y.flags.f_contiguous and not y.flags.c_contiguous else "C") == meta["order"]
    assert_decodes_as_written(y, meta["sha256"], tp.info(blob), lambda: _golden_inputs()[name][0])
    assert tp.info(blob)["format_version"] == int(version_dir.name[1:])


def assert_decodes_as_written(y, sha256: str, info: dict, original) -> None:
    """``y`` has the bits the writer decoded (``sha256``). Except under ``sz`` with a
    ``pw_rel`` bound, whose values come back through exp2, which may round an ulp
    differently on another CPU (compress/sz/special_values.py): there ``y`` must hold the
    bound on every element of ``original()``, the array that was compressed."""
    if hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest() == sha256:
        return
    bound = info["bound"]
    assert info["codec"] == "sz" and bound["mode"] == "pw_rel", "decoded bits changed"
    x = np.asarray(original(), np.float64)
    err = np.abs(y.astype(np.float64) - x)
    assert np.all((err <= bound["tolerance"] * np.abs(x)) & (np.signbit(x) == np.signbit(y)))


def _golden_inputs():
    """make_golden.py's inputs, by name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_golden", DATA / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: (x, kw) for name, x, kw in module.cases()}


@pytest.mark.parametrize(
    "name",
    ["block_f32_mixed", "block_f64_pw_rel", "block_f16_abs"]
    + ["block2_f32_mixed", "block2_f64_pw_rel", "block2_f16_abs", "block2_bf16_rel"],
)
def test_block_encoder_writes_the_golden_bytes(name):
    """The block codec's bytes are fixed by its specification (every implementation, the
    numba, torch and CUDA ones, writes them), so its encoder must still write the file."""
    x, kw = _golden_inputs()[name]
    blob = tp.compress(x, **kw)
    for version_dir in VERSION_DIRS:
        assert _payloads(blob) == _payloads((version_dir / f"{name}.tp").read_bytes())
    assert blob == (DATA / f"v{FORMAT_VERSION}" / f"{name}.tp").read_bytes()


def _payloads(blob) -> tuple:
    """The chunk payloads of a stream, as bytes: what a codec wrote, in any format version."""
    h = read_header(blob)
    return tuple(bytes(blob[o : o + n]) for o, n in zip(h.offsets, h.lengths, strict=True))


def test_first_block_layout_is_refused_on_every_path():
    """A stream in ``block``'s dropped first layout (chunk mode 0) raises an error that
    names the layout, from the numba kernels and from the torch ops; never wrong values."""
    from tensorpress.compress import decompress_tensor
    from tensorpress.formats import FormatError, tensor_from_stream
    from test_block import torch_ops_on_cpu

    blob = (DATA / "block_first_layout_f32.tp").read_bytes()
    with pytest.raises(FormatError, match="first block layout"):
        tp.decompress(blob)
    for ops in (False, True):
        with torch_ops_on_cpu() if ops else contextlib.nullcontext():
            with pytest.raises(ValueError, match="first block layout"):
                decompress_tensor(tensor_from_stream(blob))
