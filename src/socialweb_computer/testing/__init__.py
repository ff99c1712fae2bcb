"""Public test helpers: run the real apiserver as a process and reach it with real clients.

Tests and benchmarks import from here rather than from the modules behind it:

    from socialweb_computer import testing
    with testing.ApiServerProcess.start(tmp_path / "state") as server:
        server.kubectl("get", "namespaces")

`pki` makes throwaway mTLS certificates for stand-in servers (bench baseline, fakes).
`EtcdCluster` runs real etcd members on loopback for the etcd backend's tests.
"""

from socialweb_computer.testing import pki
from socialweb_computer.testing.etcd import EtcdCluster, EtcdMissingError
from socialweb_computer.testing.server import (
    ApiServerProcess,
    CommandError,
    CommandTimeout,
    Credentials,
    ServerStartError,
    ToolMissingError,
    logged_tracebacks,
    read_kubeconfig,
    tool_path,
)

__all__ = [
    "ApiServerProcess",
    "CommandError",
    "CommandTimeout",
    "Credentials",
    "EtcdCluster",
    "EtcdMissingError",
    "ServerStartError",
    "ToolMissingError",
    "logged_tracebacks",
    "pki",
    "read_kubeconfig",
    "tool_path",
]
