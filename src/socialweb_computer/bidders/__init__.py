"""Bidders start and stop nodes for tenant clusters: `sandbox` (namespaced host processes) and,
with guest images, `qemu` (microVMs). See `base.py` for the interface."""
