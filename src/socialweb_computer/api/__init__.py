"""Leaf package: plain Kubernetes object helpers and the Status error model.

Everything else may import from here; this package imports nothing of ours.
"""
