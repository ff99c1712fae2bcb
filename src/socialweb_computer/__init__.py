"""socialweb-computer: one host, many Kubernetes clusters for CI."""

__version__ = "0.1.0"
