"""Selective activation checkpointing whose saved outputs are compressed.

``torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)`` gives two
dispatch modes sharing one cache: the forward's keeps the outputs of the ops the
policy saves (``MUST_SAVE``/``PREFER_SAVE``), the recompute's hands them back instead
of running those ops again. Those outputs never pass through a saved-tensor hook, so
a block's compression cannot see them. :func:`selective_checkpoint_contexts` makes the
same pair with a cache that holds each saved output as the running block's pack hook
makes it (``per_block.py``), and restores it through the block's unpack hook: what the
policy recomputes is never encoded, what it saves is. Outside a compressed block, or
with ``allow_cache_entry_mutation=True`` (an entry edited in place after it was cached
must be seen edited, and a compressed entry is a snapshot), the cache is torch's own.

The cache torch builds is the modes' ``storage`` attribute, a dict of dicts, which is
not a stable torch API: the torch releases this was tested with are listed, and on
another one a mode without that attribute is refused with an error that says so.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts

from . import per_block

#: torch releases (major.minor) whose selective-checkpoint cache this was tested with
TESTED_TORCH = ("2.13",)


class _Held:
    """A cached output held by a block's pack hook: ``get_val`` restores it (the name
    and signature of torch's ``_VersionWrapper``, which the recompute mode calls)."""

    __slots__ = ("_record", "_unpack")

    def __init__(self, record, unpack):
        self._record, self._unpack = record, unpack

    def get_val(self, allow_cache_entry_mutation: bool) -> torch.Tensor:
        return self._unpack(self._record)  # raises if it was edited in place


def _held(entry, pack, unpack):
    """``entry`` (a wrapper with ``val``, or a sentinel) with a tensor's value held by
    ``pack``; anything else unchanged."""
    val = getattr(entry, "val", None)
    if not isinstance(val, torch.Tensor) or not hasattr(entry, "get_val"):
        return entry
    return _Held(pack(val), unpack)


class _Entries(dict):
    """One op's cache entries (call index -> output tree), each held compressed."""

    def __init__(self, pack, unpack):
        super().__init__()
        self._pair = (pack, unpack)

    def __setitem__(self, idx, entry) -> None:
        pack, unpack = self._pair
        entry = torch.utils._pytree.tree_map(lambda e: _held(e, pack, unpack), entry)
        super().__setitem__(idx, entry)


class _Storage(defaultdict):
    """The selective checkpoint's cache: op -> :class:`_Entries`."""

    def __init__(self, pack, unpack):
        super().__init__(lambda: _Entries(pack, unpack))


def _check_modes(modes) -> None:
    for mode in modes:
        if not isinstance(getattr(mode, "storage", None), dict):
            raise RuntimeError(
                f"torch {torch.__version__}'s selective checkpoint modes keep no 'storage' "
                f"cache (tested with torch {', '.join(TESTED_TORCH)}): use "
                "torch.utils.checkpoint.create_selective_checkpoint_contexts, whose saved "
                "outputs are then held uncompressed"
            )


def selective_checkpoint_contexts(policy_fn_or_list, allow_cache_entry_mutation: bool = False):
    """``torch.utils.checkpoint.create_selective_checkpoint_contexts`` (same arguments)
    whose saved outputs are held by the running block's compression, for
    ``checkpoint(..., use_reentrant=False, context_fn=partial(this, policy))`` inside a
    block given compression by :func:`~.per_block.apply_activation_compression`."""
    forward, recompute = create_selective_checkpoint_contexts(
        policy_fn_or_list, allow_cache_entry_mutation
    )
    if allow_cache_entry_mutation or not per_block.RUNNING:
        return forward, recompute
    _check_modes((forward, recompute))
    _, pair = per_block.RUNNING[-1]
    forward.storage = recompute.storage = _Storage(*pair)
    return forward, recompute
