"""torch is an extra: the numpy API and the whole command line work where it cannot be
imported, and a torch feature used there says to install ``tensorpress[torch]``.

Each check runs in a fresh interpreter whose ``sys.meta_path`` refuses torch (and triton),
as an environment without them would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import tensorpress as tp

BLOCK_TORCH = textwrap.dedent(
    """
    import sys

    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "triton"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _NoTorch())
    """
)
RUN_CLI = BLOCK_TORCH + textwrap.dedent(
    """
    import json
    from tensorpress.cli import main

    for args in json.loads(sys.argv[1]):  # one interpreter for several commands
        status = main(args)
        assert "torch" not in sys.modules
        if status:
            sys.exit(status)
    """
)
ADVICE = "tensorpress[torch]"


def _python(code: str, *args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _cli(*commands, cwd) -> subprocess.CompletedProcess:
    """Run each command (a list of arguments) in turn in one interpreter without torch;
    stop at the first that fails."""
    return _python(RUN_CLI, json.dumps(commands), cwd=cwd)


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    field = np.cumsum(rng.standard_normal((64, 48)), axis=1).astype(np.float32)
    np.save(tmp_path / "field.npy", field)
    with h5py.File(tmp_path / "sim.h5", "w") as f:
        f["fields/u"] = np.cumsum(rng.standard_normal((40, 30)), axis=0)
        f["fields/u"].attrs["units"] = "m/s"
        f["steps"] = np.arange(12)
    import torch  # here, not in the interpreters under test: a bfloat16 stream to refuse

    t = torch.linspace(0, 1, 500, dtype=torch.bfloat16)
    (tmp_path / "bf16.tp").write_bytes(tp.compress(t, rel=1e-2, codec="block"))
    return tmp_path


def test_the_command_line_runs_without_torch_on_npy(files):
    run = _cli(
        ["compress", "field.npy", "field.tp", "--rel", "1e-3"],
        ["info", "field.tp"],
        ["verify", "field.npy", "field.tp"],
        ["decompress", "field.tp", "back.npy"],
        cwd=files,
    )
    assert run.returncode == 0, run.stderr
    x, y = np.load(files / "field.npy"), np.load(files / "back.npy")
    assert np.abs(x - y).max() <= 1e-3 * (x.max() - x.min())


def test_the_command_line_runs_without_torch_on_hdf5(files):
    run = _cli(
        ["compress", "sim.h5", "sim.tp.h5", "--rel", "1e-3"],
        ["info", "sim.tp.h5"],
        ["verify", "sim.h5", "sim.tp.h5"],
        ["decompress", "sim.tp.h5", "back.h5"],
        cwd=files,
    )
    assert run.returncode == 0, run.stderr
    with h5py.File(files / "sim.h5") as a, h5py.File(files / "back.h5") as b:
        u = a["fields/u"][...]
        assert np.abs(b["fields/u"][...] - u).max() <= 1e-3 * (u.max() - u.min())
        assert b["fields/u"].attrs["units"] == "m/s"
        np.testing.assert_array_equal(b["steps"][...], a["steps"][...])


def test_the_demo_runs_without_torch(files):
    run = _cli(["demo", "--rel", "1e-2"], cwd=files)
    assert run.returncode == 0, run.stderr
    assert "activation" in run.stdout and "bound held on every element" in run.stdout


def test_a_bfloat16_stream_without_torch_says_what_to_install(files):
    run = _cli(["decompress", "bf16.tp", "bf16.bin"], cwd=files)
    assert run.returncode != 0
    assert ADVICE in run.stderr and "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert not (files / "bf16.bin").exists()


API_SCRIPT = BLOCK_TORCH + textwrap.dedent(
    """
    import array, json
    import numpy as np
    import tensorpress as tp

    out = {}
    x = np.linspace(-1, 1, 4096).reshape(64, 64)
    blob = tp.compress(x, rel=1e-3)
    out["error"] = float(np.abs(tp.decompress(blob) - x).max())
    out["tolerance"] = tp.info(blob)["bound"]["tolerance"]
    out["list"] = tp.decompress(tp.compress([1.0, 2.0, 4.0], abs=1e-3)).tolist()
    out["array"] = tp.decompress(tp.compress(array.array("f", [1, 2]), abs=0.1)).tolist()
    with open(sys.argv[1], "wb") as f:
        f.write(blob)
    out["open"] = tp.open(sys.argv[1])["data"][2:4].shape
    refused = {}
    for name, call in {
        "bfloat16 compress": lambda: tp.compress(
            np.zeros(8, dtype=__import__("ml_dtypes").bfloat16), rel=1e-2, codec="block"
        ),
        "bfloat16 decompress": lambda: tp.decompress(open(sys.argv[2], "rb").read()),
        "compress_tensor": lambda: tp.compress.compress_tensor,
        "tensor_from_stream": lambda: __import__("tensorpress.formats").formats.tensor_from_stream,
        "activation_offload": lambda: __import__("tensorpress.activation_offload"),
        "loaders": lambda: __import__("tensorpress.loaders"),
        "comm_hooks": lambda: __import__("tensorpress.distributed.comm_hooks"),
    }.items():
        try:
            call()
        except ImportError as exc:
            refused[name] = str(exc)
    out["refused"] = refused
    out["torch imported"] = "torch" in sys.modules
    print(json.dumps(out))
    """
)


def test_the_numpy_api_runs_without_torch_and_torch_features_say_what_to_install(files):
    run = _python(API_SCRIPT, files / "x.tp", files / "bf16.tp", cwd=files)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["error"] <= out["tolerance"] and out["tolerance"] > 0
    assert out["list"] == pytest.approx([1.0, 2.0, 4.0], abs=1e-3)
    assert out["array"] == pytest.approx([1.0, 2.0], abs=0.1)
    assert out["open"] == [2, 64]
    assert not out["torch imported"]
    names = {
        "bfloat16 compress",
        "bfloat16 decompress",
        "compress_tensor",
        "tensor_from_stream",
        "activation_offload",
        "loaders",
        "comm_hooks",
    }
    assert set(out["refused"]) == names
    for name, message in out["refused"].items():
        assert ADVICE in message and "\n" not in message, name
