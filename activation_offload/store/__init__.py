"""A general offload store: device tensors moved to pinned CPU memory and NVMe files.

``tiered.py`` holds :class:`TieredStore` (the tiers, prefetch in reverse order), its
bookkeeping ``state.py``, the pinned host pool ``host_memory.py``, the NVMe spill files
``spill*.py`` (layout, O_DIRECT writes and reads, directories), and optimizer-state
offload ``optimizer.py``, which keeps an optimizer's state in the same store.
"""

from .tiered import Handle, HostMemoryFull, StoreStats, TieredStore

__all__ = ["Handle", "HostMemoryFull", "StoreStats", "TieredStore"]
