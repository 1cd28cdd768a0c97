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
