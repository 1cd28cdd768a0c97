"""Build the tensorpress HDF5 filter plugin with the system C compiler.

A plain shared library (not a Python extension) that HDF5 loads from
``HDF5_PLUGIN_PATH``: C11, no C++ runtime, not linked against libhdf5 or libzstd
(zstd is loaded at run time, see ``zstd_dl.c``). pyproject.toml names
:class:`BuildPyWithPlugin` as setuptools' ``build_py`` command, which calls
:func:`build_library` at install; the tests call :func:`build_driver` for the
sanitizer build of the command-line decoder. This file imports nothing from
tensorpress: setuptools loads it by its path before tensorpress is installed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: the library's file name: hdf5plugin's ``libh5<name>`` convention
LIBRARY = "libh5tensorpress.so"
#: the decoder's sources (driver.c and plugin.c are the two front ends)
SOURCES = (
    "crc32.c",
    "json.c",
    "header.c",
    "missing.c",
    "stream.c",
    "zstd_dl.c",
    "codec_zstd.c",
    "codec_int8.c",
    "codec_block.c",
    "block_index.c",
    "half.c",
    "cd_values.c",
    "block_encode.c",
    "stream_encode.c",
    "codec_sz.c",
    "sz_huffman.c",
    "sz_predictors.c",
    "sz_lorenzo.c",
    "sz_constant.c",
    "sz_regression.c",
    "sz_interp.c",
    "sz_fitted.c",
    "sz_match.c",
    "sz_pivot.c",
    "sz_wavelet.c",
    "sz_cdf97.c",
    "codec_quant.c",
    "sz_speck.c",
    "quant_encode.c",
)
#: strict C11; no -ffast-math: the float roundings must be IEEE's, as numpy's, and no
#: contraction into FMAs (one rounding where numba rounds twice). -O3 so the decoder's and
#: encoder's inner loops vectorize
FP_FLAGS = ("-ffp-contract=off",)
CFLAGS = ("-std=c11", "-O3", "-Wall", "-Wextra", "-fPIC", "-fvisibility=hidden", *FP_FLAGS)
LIBS = ("-ldl", "-lpthread", "-lm")


class BuildError(RuntimeError):
    """The compiler is missing or failed; the message says which and why."""


def version_define() -> str:
    """``-DTP_VERSION="x.y.z"``: tensorpress's version (``_version.py`` at the package
    root), which every stream header the plugin writes names, as Python's writer does."""
    text = (HERE.parent.parent / "_version.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if match is None:
        raise BuildError("_version.py has no __version__ line")
    return f'-DTP_VERSION="{match.group(1)}"'


def compiler() -> list[str]:
    """The C compiler: ``$CC``, else the one Python was built with, else cc/gcc/clang."""
    for cc in (os.environ.get("CC"), sysconfig.get_config_var("CC"), "cc", "gcc", "clang"):
        if cc:
            argv = shlex.split(cc)
            if argv and shutil.which(argv[0]):
                return argv[:1]  # flags of Python's own build do not apply to this library
    raise BuildError("no C compiler found (set CC, or install cc, gcc or clang)")


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise BuildError(f"{' '.join(argv[:1])} failed: " + " | ".join(tail))


def build_library(out_dir: str | os.PathLike, extra: tuple[str, ...] = ()) -> Path:
    """Compile the plugin into ``out_dir``/:data:`LIBRARY` (written to a temporary file
    and renamed, so a reader never sees half a library); returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / LIBRARY
    fd, tmp = tempfile.mkstemp(prefix=".libh5tensorpress.", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        sources = [str(HERE / s) for s in (*SOURCES, "plugin.c")]
        flags = [*CFLAGS, version_define(), *extra]
        _run([*compiler(), *flags, "-shared", "-o", tmp, *sources, *LIBS])
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def build_driver(out: str | os.PathLike, sanitize: bool = True) -> Path:
    """Compile the command-line decoder and encoder (driver.c) to ``out``, with AddressSanitizer and
    UndefinedBehaviorSanitizer (any report aborts) unless ``sanitize`` is False."""
    flags = ["-std=c11", "-g", "-O1", "-Wall", "-Wextra", *FP_FLAGS]
    if sanitize:
        flags += ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    flags += ["-fno-omit-frame-pointer", version_define()]
    sources = [str(HERE / s) for s in (*SOURCES, "driver.c")]
    _run([*compiler(), *flags, "-o", str(out), *sources, *LIBS])
    return Path(out)


class BuildPyWithPlugin(build_py):
    """setuptools' build_py, then the plugin's library beside the package's modules (for
    an editable install, into the source tree). pyproject.toml names it as the
    ``build_py`` command. Without a compiler it says so and the install goes on."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            out = HERE
        else:
            out = Path(self.build_lib, "tensorpress", "formats", "hdf5_plugin")
        try:
            path = build_library(out)
        except BuildError as exc:
            print(
                f"tensorpress: the HDF5 plugin was not built ({exc}); tensorpress works "
                "without it, but only Python processes that import tensorpress read its "
                "filter datasets",
                file=sys.stderr,
            )
            return
        print(f"tensorpress: built the HDF5 plugin {path}", file=sys.stderr)


if __name__ == "__main__":  # python formats/hdf5_plugin/build.py: build it in place
    print(build_library(HERE))
