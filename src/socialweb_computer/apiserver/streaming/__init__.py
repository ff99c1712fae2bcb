"""Streaming subresources of pods: the apiserver's half of logs, exec, attach and port-forward.

The apiserver authenticates and authorizes the request (verb `get` on `pods/log`, `create`
on `pods/exec`, ...), finds the pod's node and reaches that node's agent through the
cluster's `NodeDialer`, which the gateway provides from what its bidders started: a unix
socket for a sandbox node, a loopback-forwarded port for a microVM node. Nothing on this
path listens on a non-loopback address, and no node is reached that its cluster does not
own. Registered as subresource handlers by `gateway/tenants.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import aiohttp


@dataclasses.dataclass(frozen=True)
class NodeEndpoint:
    """How to reach one node's agent: a unix socket (sandbox) or a TCP address with TLS."""

    unix_socket: str = ""
    host: str = ""
    port: int = 0

    def connector(self) -> aiohttp.BaseConnector:
        if self.unix_socket:
            return aiohttp.UnixConnector(path=self.unix_socket)
        return aiohttp.TCPConnector()

    @property
    def base_url(self) -> str:
        return "http://node" if self.unix_socket else f"http://{self.host}:{self.port}"


class NodeDialer(Protocol):
    def endpoint(self, node_name: str) -> NodeEndpoint | None:
        """The agent of `node_name` if this cluster owns that node and it runs; else None."""
