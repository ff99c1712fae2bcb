"""The node's container runtime: containerd's CRI over gRPC (stubs generated at build time)."""
