"""Communication compression for torch.distributed: DDP gradient hooks, a sharded
optimizer whose weights travel as quantized differences, a compressed all-to-all for
sharded embedding tables, and their wire accounting.

The distributed engine is PyTorch's; these modules only make the bytes smaller.
Import the module you use (``tensorpress.distributed.comm_hooks``,
``.sharded_optimizer``, ``.weight_diff``, ``.embedding_a2a``, ``.adaptive_bounds``):
each imports torch.distributed. ``.wire`` is the group-quantized wire format the
first two share; ``.a2a_exchange`` the all-to-all's header and payload exchange.
"""

from .._util.optional_torch import torch as _torch  # noqa: F401  (install advice)

__all__ = [
    "a2a_exchange",
    "adaptive_bounds",
    "comm_hooks",
    "embedding_a2a",
    "sharded_optimizer",
    "weight_diff",
    "wire",
]
