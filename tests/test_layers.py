"""The layers of DESIGN.md hold: every import of ours points down, and none forms a cycle.

    cli ──► the package root (tensorpress/__init__.py)
    files ──► formats                        (the whole-file jobs the command line runs)
    activation_offload, loaders, distributed ──► formats ──► compress ──► _util

The integrations in the middle never import each other; ``_version`` is a leaf and
``_util`` the ground floor (thread pools, scratch buffers, the numba cache, hashing,
optional torch) that anyone may import. Every ``import`` statement counts, function-level ones too.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "tensorpress"
#: a part of the package -> its layer: an import may only go to a lower layer
LAYERS = {
    "_version": 0,
    "_util": 0,  # the ground floor: imports nothing of ours but itself
    "compress": 1,
    "formats": 2,
    "files": 3,  # the whole-file jobs: above the bytes, beside the integrations
    "activation_offload": 3,
    "loaders": 3,
    "distributed": 3,
    "": 4,  # the package root's __init__.py
    "cli": 5,
    "__main__": 6,
}
NOT_PACKAGE = {"tests", "benchmarks", "docs", "build", "setup.py"}  # setup.py: the build script


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        top = path.relative_to(ROOT).parts[0]
        if top in NOT_PACKAGE or top.startswith("."):
            continue
        out[_module_name(path)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
    """The modules of ours that ``name`` imports (a package stands for its __init__)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [
                f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target
                for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target not in MODULES and "." in target:
                target = target.rpartition(".")[0]
            if target in MODULES and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _part(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_part_has_a_layer():
    unknown = sorted({_part(m) for m in MODULES} - set(LAYERS))
    assert not unknown, f"give these parts a layer in tests/test_layers.py: {unknown}"


def test_imports_point_down():
    wrong = [
        f"{src} imports {dst}"
        for src, dsts in sorted(GRAPH.items())
        for dst in sorted(dsts)
        if _part(src) != _part(dst) and LAYERS[_part(dst)] >= LAYERS[_part(src)]
    ]
    assert not wrong, "imports that point up or sideways:\n" + "\n".join(wrong)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert not _cycles(), f"modules that import each other: {_cycles()}"


def test_the_checker_sees_function_level_and_relative_imports():
    """The graph is only as good as its parser: a known function-level relative import
    and a known relative import of the package root's must be in it."""
    assert "tensorpress.formats.tensor_stream" in GRAPH["tensorpress.formats.array_stream"]
    assert "tensorpress.compress" in GRAPH["tensorpress"]


@pytest.mark.parametrize("name", ["tensorpress._version"])
def test_leaves_import_nothing_of_ours(name):
    assert GRAPH[name] == set()


#: compress/'s public contract (the package's face, the error bound, the registry, the
#: codec ABC): what activation_offload/device and loaders/ may import of it, never a codec's
#: insides
CONTRACT = DEVICE_MAY_IMPORT = {
    "tensorpress.compress",
    "tensorpress.compress.bounds",
    "tensorpress.compress.registry",
    "tensorpress.compress.codec",
}
DEVICE = "tensorpress.activation_offload.device"


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_device_encodings_live_beside_their_only_user():
    device = [m for m in MODULES if _in(m, DEVICE)]
    assert f"{DEVICE}.tiles" in device and f"{DEVICE}.ops" in device, sorted(device)
    stray = sorted(p.name for p in (ROOT / "compress").rglob("device_*.py"))
    assert not stray, f"device encodings left in compress/: {stray}"


def test_device_encodings_import_compress_only_through_its_contract():
    wrong = [
        f"{src} imports {dst}"
        for src, dsts in sorted(GRAPH.items())
        if _in(src, DEVICE)
        for dst in sorted(dsts)
        if _in(dst, "tensorpress.compress") and dst not in DEVICE_MAY_IMPORT
    ]
    assert not wrong, f"use only {sorted(DEVICE_MAY_IMPORT)}:\n" + "\n".join(wrong)


def test_only_activation_offload_imports_the_device_encodings():
    wrong = [
        f"{src} imports {dst}"
        for src, dsts in sorted(GRAPH.items())
        if not _in(src, "tensorpress.activation_offload")
        for dst in sorted(dsts)
        if _in(dst, DEVICE)
    ]
    assert not wrong, "the device encodings are activation_offload's own:\n" + "\n".join(wrong)


def test_the_file_jobs_sit_above_the_bytes():
    """``files/`` uses formats/ and below, never the command line; formats/ never uses files/
    (it is bytes on disk and on the wire, and keeps no whole-file job)."""
    files = [m for m in MODULES if _in(m, "tensorpress.files")]
    assert "tensorpress.files.compress" in files and "tensorpress.files.plan" in files, files
    up = [
        f"{src} imports {dst}"
        for src, dsts in sorted(GRAPH.items())
        for dst in sorted(dsts)
        if (_in(src, "tensorpress.files") and _in(dst, "tensorpress.cli"))
        or (_in(src, "tensorpress.formats") and _in(dst, "tensorpress.files"))
    ]
    assert not up, "\n".join(up)
    assert GRAPH["tensorpress.files.compress"] & {"tensorpress.formats.stream_writer"}
    jobs = sorted(p.name for p in (ROOT / "formats").glob("*.py") if p.stem.startswith("file_"))
    assert not jobs, f"whole-file jobs left in formats/: {jobs}"


#: the codecs' own folders inside compress/: each imports the contract (compress/'s top
#: level) and the shared kernels, never another codec's folder
CODEC_FOLDERS = ("block", "quant", "sz")


def _codec_folder(name: str) -> str | None:
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "compress" and parts[2] in CODEC_FOLDERS:
        return parts[2]
    return None


def test_compress_top_level_is_the_contract_only():
    modules = sorted(p.name for p in (ROOT / "compress").glob("*.py"))
    assert len(modules) <= 15, f"{len(modules)} modules directly in compress/: {modules}"
    folders = {p.name for p in (ROOT / "compress").iterdir() if (p / "__init__.py").exists()}
    assert set(CODEC_FOLDERS) <= folders, sorted(folders)


def test_codec_folders_do_not_import_each_other():
    wrong = [
        f"{src} imports {dst}"
        for src, dsts in sorted(GRAPH.items())
        if _codec_folder(src)
        for dst in sorted(dsts)
        if _codec_folder(dst) not in (None, _codec_folder(src))
    ]
    assert not wrong, "a codec's folder uses the contract, not another codec:\n" + "\n".join(wrong)


#: the infrastructure the ground floor holds, and where it lived before (in compress/)
GROUND = ("threads", "scratch", "numba_cache", "hashing", "optional_torch")


def test_the_ground_floor_holds_the_infrastructure_and_imports_only_itself():
    util = [m for m in MODULES if _in(m, "tensorpress._util")]
    assert {f"tensorpress._util.{name}" for name in GROUND} <= set(util), sorted(util)
    stray = sorted(
        str(p.relative_to(ROOT)) for name in GROUND for p in (ROOT / "compress").rglob(f"{name}.py")
    )
    assert not stray, f"infrastructure left in compress/: {stray}"
    wrong = [f"{m} imports {d}" for m in util for d in GRAPH[m] if not _in(d, "tensorpress._util")]
    assert not wrong, "the ground floor imports nothing above it:\n" + "\n".join(wrong)


def test_loaders_take_their_hash_from_the_ground_floor_not_a_codec_package():
    """loaders/ may use compress/'s contract (a bound, a codec by name), never its insides:
    the shuffle's hash is infrastructure, from the ground floor."""
    assert "tensorpress._util.hashing" in GRAPH["tensorpress.loaders.permutation"]
    wrong = [
        f"{src} imports {dst}"
        for src, dsts in sorted(GRAPH.items())
        if _in(src, "tensorpress.loaders")
        for dst in sorted(dsts)
        if _in(dst, "tensorpress.compress") and dst not in CONTRACT
    ]
    assert not wrong, f"use _util/ or only {sorted(CONTRACT)}:\n" + "\n".join(wrong)


def test_every_kernel_package_places_the_numba_cache_from_the_ground_floor():
    """numba picks a cached kernel's directory when the kernel is defined: each package of
    kernels calls configure_cache first, from _util (not through another kernel package)."""
    packages = sorted((ROOT / "compress").rglob("kernels/__init__.py"))
    assert len(packages) >= 4, packages
    for init in packages:
        name = _module_name(init)
        assert GRAPH[name] == {"tensorpress._util.numba_cache"}, (name, GRAPH[name])
        assert "\nconfigure_cache()" in init.read_text(), f"{name} does not call configure_cache"
