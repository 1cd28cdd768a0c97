"""Install-time build of the compiled HDF5 filter plugin (formats/hdf5_plugin/).

Everything else is in pyproject.toml. ``build_py`` compiles the plugin with the system C
compiler into the package (``tensorpress/formats/hdf5_plugin/libh5tensorpress.so``; for
an editable install, into the source tree), so ``pip install .`` and ``pip install -e .``
both ship it. Without a compiler tensorpress still installs: the build says so here,
and ``tensorpress plugin-path`` says so when asked for the plugin.
"""

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PLUGIN = Path("formats", "hdf5_plugin")


def _plugin_build():
    """formats/hdf5_plugin/build.py, loaded by path (tensorpress is not installed yet)."""
    spec = importlib.util.spec_from_file_location("_tp_plugin_build", HERE / PLUGIN / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithPlugin(build_py):
    """build_py, then the plugin's shared library beside the package's modules."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            out = HERE / PLUGIN
        else:
            out = Path(self.build_lib, "tensorpress", PLUGIN)
        build = _plugin_build()
        try:
            path = build.build_library(out)
        except build.BuildError as exc:
            print(
                f"tensorpress: the HDF5 plugin was not built ({exc}); tensorpress works "
                "without it, but only Python processes that import tensorpress read its "
                "filter datasets",
                file=sys.stderr,
            )
            return
        print(f"tensorpress: built the HDF5 plugin {path}", file=sys.stderr)


setup(cmdclass={"build_py": BuildPyWithPlugin})
