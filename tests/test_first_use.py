"""What a new user meets first: array-likes and bounds the API takes or refuses, a CUDA
device asked for where there is none, the numba cache's place and the first-compilation
notice, and torch.compile under activation compression."""

from __future__ import annotations

import array
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorpress as tp
import torch
from tensorpress._util.numba_cache import COMPILING, kernel_cache_dir
from tensorpress.activation_offload import ActivationCompression
from tensorpress.compress import ErrorBound, compress_tensor, decompress_tensor, get_codec
from tensorpress.formats import tensor_from_stream, tensor_to_stream

# -- what tp.compress takes -------------------------------------------------------------


@pytest.mark.parametrize(
    "x",
    [
        [1.0, 2.0, 4.0],
        memoryview(np.array([1.0, 2.0, 4.0])),
        array.array("f", [1.0, 2.0, 4.0]),
        [[1.0, 2.0], [3.0, 5.0]],
    ],
    ids=["list", "memoryview", "array.array", "nested list"],
)
def test_compress_takes_what_np_asarray_turns_into_a_float_array(x):
    want = np.asarray(x)
    y = tp.decompress(tp.compress(x, rel=1e-3))
    assert y.dtype == want.dtype and y.shape == want.shape
    assert np.abs(y - want).max() <= 1e-3 * (want.max() - want.min())


def test_compress_of_a_non_numeric_list_says_what_is_accepted():
    with pytest.raises(TypeError, match="numeric array"):
        tp.compress(["a", "b"], rel=1e-3)


@pytest.mark.parametrize("bad", [True, np.bool_(False), "1e-3", b"1", np.array(1e-3), None])
def test_bounds_that_are_not_real_numbers_are_refused(bad):
    x = np.linspace(0, 1, 100)
    if bad is None:
        with pytest.raises(ValueError, match="exactly one error bound"):
            tp.compress(x, rel=bad)
        return
    with pytest.raises(ValueError, match="must be a real number"):
        tp.compress(x, rel=bad)
    with pytest.raises(ValueError, match="must be a real number"):
        get_codec("block", abs=bad)
    with pytest.raises(ValueError, match="must be a real number"):
        ErrorBound("pw_rel", bad)


@pytest.mark.parametrize("good", [1e-3, 1, np.float32(1e-3), np.int64(1)])
def test_real_bounds_of_any_numeric_type_are_taken(good):
    x = np.linspace(0, 1, 100)
    assert tp.info(tp.compress(x, abs=good))["bound"]["value"] == float(good)


# -- a CUDA device where there is none ---------------------------------------------------

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")


@no_cuda
def test_decompress_tensor_on_cuda_without_cuda_says_so():
    ct = compress_tensor(torch.linspace(0, 1, 1000), rel=1e-3)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        decompress_tensor(ct, device="cuda")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        ct.to(torch.device("cuda", 0))
    assert torch.equal(decompress_tensor(ct, device="cpu"), decompress_tensor(ct))


@no_cuda
def test_tensor_from_stream_on_cuda_without_cuda_says_so():
    blob = tensor_to_stream(compress_tensor(torch.linspace(0, 1, 1000), rel=1e-3))
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        tensor_from_stream(blob, device="cuda")
    assert tensor_from_stream(blob, device="cpu").device.type == "cpu"


# -- the numba cache -----------------------------------------------------------------------


def test_a_users_numba_cache_dir_is_kept(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "mine"), "XDG_CACHE_HOME": str(tmp_path)}
    assert kernel_cache_dir(not_a_dir, env) is None


def test_a_writable_package_dir_keeps_numbas_cache_beside_the_sources(tmp_path):
    assert kernel_cache_dir(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "cache")}) is None
    assert (tmp_path / "__pycache__").is_dir()
    assert not (tmp_path / "cache").exists()


def test_a_package_dir_that_cannot_be_written_caches_in_the_user_cache(tmp_path):
    read_only = tmp_path / "file"  # a directory that can never be created under a file
    read_only.write_text("")
    path = kernel_cache_dir(read_only, {"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert path == str(tmp_path / "cache" / "tensorpress" / "numba")
    assert os.path.isdir(path)
    # no writable user cache either (XDG_CACHE_HOME is a file): a directory under /tmp
    path = kernel_cache_dir(read_only, {"XDG_CACHE_HOME": str(read_only)})
    assert path is not None and os.path.isdir(path)
    assert os.path.commonpath([path, os.path.realpath(__import__("tempfile").gettempdir())])


def test_the_cli_says_once_that_a_first_run_compiles(tmp_path):
    np.save(tmp_path / "x.npy", np.linspace(0, 1, 5000, dtype=np.float32).reshape(50, 100))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}  # an empty cache

    def run(out):
        # block compiles a handful of kernels where sz compiles dozens: the notice is the same
        args = ["compress", "x.npy", out, "--rel", "1e-3", "--codec", "block"]
        return subprocess.run(
            [sys.executable, "-m", "tensorpress", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    first = run("a.tp")
    assert first.returncode == 0, first.stderr
    assert first.stderr.count(COMPILING) == 1
    second = run("b.tp")  # the kernels now load from the cache
    assert second.returncode == 0, second.stderr
    assert COMPILING not in second.stderr
    assert (tmp_path / "a.tp").read_bytes() == (tmp_path / "b.tp").read_bytes()


# -- torch.compile under ActivationCompression -------------------------------------------

GLOBAL_HOOKS = "global hooks on modules"


def _torch_compile(model):
    return torch.compile(model, backend="aot_eager")


def _compile_in_place(model):
    model.compile(backend="aot_eager")
    return model


def _train_step(compile_model, name_model=True, **settings):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 4))
    run = compile_model(model)
    ac = ActivationCompression("block", rel=1e-2, model=model if name_model else None, **settings)
    x = torch.randn(512, 32, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ac:
            loss = run(x).square().mean()
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return [str(w.message) for w in caught], ac.stats, grads


def _assert_grads_close(grads, eager_grads):
    for a, b in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.05 * float(b.abs().max()))


@pytest.mark.parametrize("compile_model", [_torch_compile, _compile_in_place])
@pytest.mark.parametrize("min_bytes", [0, 1 << 16])
def test_a_compiled_model_trains_under_activation_compression(compile_model, min_bytes):
    """torch.compile(model) and model.compile() train under ActivationCompression given
    the model, with no warning from torch: the tensors saved inside the compiled graph
    are compressed under the bound and counted under the model's row (the loss after it
    under "(outside)"), and the gradients are the eager model's within the bound
    (docs/activations.md)."""
    messages, stats, grads = _train_step(compile_model, min_bytes=min_bytes)
    assert not [w for w in messages if GLOBAL_HOOKS in w]
    assert set(stats.rows) == {"(top)", "(outside)"}
    assert stats.rows["(top)"].saved_bytes > stats.rows["(top)"].stored_bytes > 0
    _, eager_stats, eager_grads = _train_step(lambda m: m, min_bytes=min_bytes)
    assert eager_stats.saved_bytes > 0
    _assert_grads_close(grads, eager_grads)


def test_torch_compile_without_the_model_named_warns_and_still_compresses():
    """With no model given, modules are found through torch's global module hooks:
    torch.compile(model) warns that they fire once more, for the wrapper it returns;
    nothing is saved or counted twice and the gradients hold (docs/activations.md)."""
    messages, stats, grads = _train_step(_torch_compile, name_model=False)
    assert messages and all(GLOBAL_HOOKS in w for w in messages)
    assert stats.saved_bytes > stats.stored_bytes > 0
    assert sum(row.saves for row in stats.rows.values()) == 4  # 3 in the model, 1 in the loss
    _, _, eager_grads = _train_step(lambda m: m, name_model=False)
    _assert_grads_close(grads, eager_grads)
