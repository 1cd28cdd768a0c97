"""The package root is a face, and ``tensorpress.compress`` is one object whichever way
it is imported: the codecs package, callable as ``tp.compress(x, rel=1e-3)``."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: what users write first, each in a fresh interpreter (the import system binds a
#: subpackage to its parent's attribute only when it first loads it, so order matters)
FIRST_IMPORTS = {
    "the root": "import tensorpress",
    "the codecs package": "import tensorpress.compress",
    "a codec module": "import tensorpress.compress.sz",
    "a name from the package": "from tensorpress.compress import ErrorBound, get_codec",
    "the package under another name": "import tensorpress.compress as c",
    "the name from the root": "from tensorpress import compress",
    "the container first": "import tensorpress.formats",
    "a codec module under another name": "import tensorpress.compress.sz as sz",
}

#: run after each first import: every way of reaching the name meets the same object,
#: which compresses within its bound and holds the codecs
CHECKS = """
import sys
import numpy as np
import tensorpress as tp
import tensorpress.compress as by_alias
import tensorpress.compress.sz
from tensorpress import compress as by_from
from tensorpress.compress import ErrorBound, get_codec

package = sys.modules["tensorpress.compress"]
assert tp.compress is package is by_alias is by_from, "tensorpress.compress is two objects"
assert tensorpress.compress.sz.SZCodec is sys.modules["tensorpress.compress.sz"].SZCodec
assert tp.compress.get_codec("sz") == get_codec("sz") and tp.ErrorBound is ErrorBound
x = np.linspace(0, 1, 200).reshape(10, 20) ** 2
for call in (tp.compress, by_alias, by_from):
    y = tp.decompress(call(x, abs=1e-3))
    assert y.shape == x.shape and np.abs(y - x).max() <= 1e-3
print("ok")
"""


@pytest.mark.parametrize("first", FIRST_IMPORTS.values(), ids=FIRST_IMPORTS.keys())
def test_every_import_order_meets_one_callable_package(first):
    done = subprocess.run(
        [sys.executable, "-c", f"{first}\n{CHECKS}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_root_holds_only_the_face_and_the_entry_points():
    at_root = sorted(p.name for p in ROOT.glob("*.py"))
    assert at_root == ["__init__.py", "__main__.py", "_version.py"]


def test_root_init_is_re_exports_only():
    """No function or class is defined in the root: each public name lives in a module
    with a name, and the root only re-exports it."""
    source = (ROOT / "__init__.py").read_text()
    assert len(source.splitlines()) < 80
    tree = ast.parse(source)
    defined = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
    ]
    assert not defined, f"logic at the package root: {defined}"
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    import tensorpress as tp

    assert set(tp.__all__) <= imported, "every public name comes from a module import"
