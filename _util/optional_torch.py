"""torch is an optional dependency: ``pip install 'tensorpress[torch]'``.

The numpy codecs, the file formats and the command line run without it; the tensor
API, bfloat16 data, activation compression, the loaders and the distributed hooks
import torch through :func:`import_torch`, so that a missing torch says which extra
to install instead of only ``No module named 'torch'``.
"""

from __future__ import annotations

TORCH_EXTRA = "tensorpress[torch]"


def import_torch(feature: str):
    """The ``torch`` module, or a one-line ModuleNotFoundError (an ImportError) naming
    ``feature`` and the extra that installs torch."""
    try:
        import torch
    except ImportError:
        raise ModuleNotFoundError(
            f"{feature} needs PyTorch: install {TORCH_EXTRA} "
            f"(pip install '{TORCH_EXTRA}'), or torch itself",
            name="torch",
        ) from None
    return torch


def check_device(device) -> None:
    """Raise RuntimeError when ``device`` (a torch device or its name) is a CUDA device
    and CUDA cannot be used here; None and other devices pass."""
    if device is None:
        return
    torch = import_torch("placing tensors on a device")
    if torch.device(device).type != "cuda" or torch.cuda.is_available():
        return
    why = (
        "this torch is a CPU-only build"
        if torch.version.cuda is None
        else "no CUDA device is visible"
    )
    raise RuntimeError(
        f"CUDA is not available ({why}, torch {torch.__version__}): cannot place the "
        f"tensor on {device!r}; decode on the CPU with device='cpu'"
    )


def __getattr__(name):
    """``from tensorpress._util.optional_torch import torch``: torch, or the advice
    (the first import of the parts of tensorpress that are built on torch)."""
    if name == "torch":
        return import_torch(
            "this part of tensorpress (tensors, activation compression, loaders, distributed hooks)"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
