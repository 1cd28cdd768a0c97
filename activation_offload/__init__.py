"""Activation compression and tiered offload (saved-tensor hooks)."""
