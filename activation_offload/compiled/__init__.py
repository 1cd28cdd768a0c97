"""Saved activations held as codes inside graphs that inductor compiles.

```python
from tensorpress.activation_offload import compile_with_compression

model = compile_with_compression(model, rel=1e-2)  # torch.compile(model), inductor
loss = loss_fn(model(x), y)
loss.backward()
model.compression.saved  # bytes the compiled forwards save, before and after
```

``partition.py`` says what is encoded and where; ``ops.py`` the records.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomPartitionerFn, get_hash_for_files

from .partition import KEEP, SavedBytes, encode_saved

__all__ = ["KEEP", "CompiledCompression", "SavedBytes", "compile_with_compression"]

#: tensors under this many elements are saved as they are (a record's scalars and the
#: ops' launches cost more than they save)
MIN_ELEMENTS = 4096
_HERE = os.path.dirname(os.path.abspath(__file__))
_FILES = ("partition.py", "ops.py", "cpu_codes.py", "graph_codes.py", "recompute.py")
_SOURCES = tuple(os.path.join(_HERE, f) for f in _FILES)


class CompiledCompression(CustomPartitionerFn):
    """Inductor's partitioner, then each chosen saved tensor held as codes within
    ``rel`` of its finite range (``rel=None``: nothing encoded, the saved bytes only
    counted). ``memory_budget``: the partitioner's activation memory budget, the
    fraction of the saved bytes it may keep (below 1 it recomputes cheap producers from
    fewer saved tensors). ``saved`` sums what the compiled forwards save, in bytes."""

    def __init__(
        self,
        rel: float | None = 1e-2,
        min_elements: int = MIN_ELEMENTS,
        memory_budget: float = 1.0,
    ):
        if rel is not None and not (isinstance(rel, (int, float)) and 1e-6 <= rel < 1):
            raise ValueError(f"rel must be a float in [1e-6, 1), got {rel!r}")
        if not (isinstance(memory_budget, (int, float)) and 0 < memory_budget <= 1):
            raise ValueError(f"memory_budget must be a float in (0, 1], got {memory_budget!r}")
        self.rel = None if rel is None else float(rel)
        self.min_elements = int(min_elements)
        self.memory_budget = float(memory_budget)
        self.saved = SavedBytes()
        self._key = uuid.uuid4().hex

    def __call__(self, gm: torch.fx.GraphModule, joint_inputs, **kwargs: Any):
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        budget = self.memory_budget
        with torch._functorch.config.patch(activation_memory_budget=budget):
            fw, bw = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        encode_saved(fw, bw, kwargs["num_fwd_outputs"], self.rel, self.min_elements, self.saved)
        return fw, bw

    def uuid(self):
        # inductor's caches key graphs on this; a cached graph skips the partitioner and
        # so ``saved``'s counting: each instance is its own key (the kernels' compiled
        # code is still cached by its source)
        return (
            get_hash_for_files(_SOURCES),
            self.rel,
            self.min_elements,
            self.memory_budget,
            self._key,
        )

    @property
    def options(self) -> dict:
        """``torch.compile(..., options=...)`` that applies this pass."""
        return {"custom_partitioner_fn": self}

    def compile(self, model, **kwargs):
        """``torch.compile(model, **kwargs)`` with the pass (inductor backend); the
        result's ``compression`` is this object."""
        if kwargs.get("backend", "inductor") != "inductor":
            raise ValueError(
                "compiled compression runs in inductor's partitioner: use backend='inductor'"
            )
        options = {**(kwargs.pop("options", None) or {}), **self.options}
        compiled = torch.compile(model, options=options, **kwargs)
        compiled.compression = self
        return compiled


def compile_with_compression(
    model,
    *,
    rel: float = 1e-2,
    min_elements: int = MIN_ELEMENTS,
    memory_budget: float = 1.0,
    **kwargs,
):
    """``torch.compile(model, **kwargs)`` whose graphs hold saved activations as codes
    within ``rel`` of each tensor's range (:class:`CompiledCompression`)."""
    return CompiledCompression(rel, min_elements, memory_budget).compile(model, **kwargs)
