"""Communication compression for torch.distributed: DDP gradient hooks, a sharded
optimizer whose weights travel as quantized differences, and their wire accounting.

The distributed engine is PyTorch's; these modules only make the bytes smaller.
Import the module you use (``tensorpress.distributed.comm_hooks``,
``.sharded_optimizer``, ``.weight_diff``): each imports torch.distributed.
``.wire`` is the group-quantized wire format they share.
"""

__all__ = ["comm_hooks", "sharded_optimizer", "weight_diff", "wire"]
