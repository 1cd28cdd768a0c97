"""Golden streams of every released format version keep decoding, bit for bit."""

import hashlib
import json
import pathlib

import numpy as np
import pytest
import tensorpress as tp

DATA = pathlib.Path(__file__).parent / "data"
CASES = [
    (version_dir, name, meta)
    for version_dir in sorted(DATA.glob("v*"))
    for name, meta in json.loads((version_dir / "manifest.json").read_text()).items()
]


def test_golden_files_exist():
    assert len(CASES) >= 10


@pytest.mark.parametrize(
    ("version_dir", "name", "meta"), CASES, ids=[f"{v.name}-{n}" for v, n, _ in CASES]
)
def test_golden_decodes(version_dir, name, meta):
    blob = (version_dir / f"{name}.tp").read_bytes()
    y = tp.decompress(blob)
    assert str(y.dtype) == meta["dtype"]
    assert list(y.shape) == meta["shape"]
    assert ("F" if y.flags.f_contiguous and not y.flags.c_contiguous else "C") == meta["order"]
    assert hashlib.sha256(np.ascontiguousarray(y).tobytes()).hexdigest() == meta["sha256"]
    assert tp.info(blob)["format_version"] == int(version_dir.name[1:])


def _golden_inputs():
    """make_golden.py's inputs, by name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_golden", DATA / "make_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: (x, kw) for name, x, kw in module.cases()}


@pytest.mark.parametrize("name", ["block_f32_mixed", "block_f64_pw_rel", "block_f16_abs"])
def test_block_encoder_writes_the_golden_bytes(name):
    """The block codec's bytes are fixed by its specification (every implementation, the
    numba, torch and CUDA ones, writes them), so its encoder must still write the file."""
    x, kw = _golden_inputs()[name]
    assert tp.compress(x, **kw) == (DATA / "v1" / f"{name}.tp").read_bytes()
