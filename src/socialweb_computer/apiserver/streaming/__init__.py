"""Streaming subresources of pods: the apiserver's half of logs, exec, attach and port-forward.

The apiserver authenticates and authorizes the request (verb `get` on `pods/log`, `create`
on `pods/exec`, ...), finds the pod's node and reaches that node's agent through the
cluster's `NodeDialer`, which the gateway provides from what its bidders started: a unix
socket for a sandbox node, a loopback-forwarded port for a microVM node. Nothing on this
path listens on a non-loopback address, and no node is reached that its cluster does not
own. Registered as subresource handlers by `gateway/tenants.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from typing import Protocol

import aiohttp

from socialweb_computer import netio


@dataclasses.dataclass(frozen=True)
class NodeEndpoint:
    """How to reach one node's agent: a unix socket (sandbox) or a TCP address with TLS.

    Over TCP (a loopback port forwarded to a microVM's agent: any local account can connect
    to it) both sides authenticate: the agent's certificate is verified against `ca_file`
    (that node's own CA), and the apiserver presents `cert_file`/`key_file`, its
    kube-apiserver-kubelet-client identity from the cluster's ClientCA.
    """

    unix_socket: str = ""
    host: str = ""
    port: int = 0
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.ca_file:
            return None
        context = ssl.create_default_context(cafile=self.ca_file)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def connector(self) -> aiohttp.BaseConnector:
        if self.unix_socket:
            return aiohttp.UnixConnector(path=self.unix_socket)
        context = self.ssl_context()
        return aiohttp.TCPConnector(ssl=context) if context is not None else aiohttp.TCPConnector()

    @property
    def base_url(self) -> str:
        if self.unix_socket:
            return "http://node"
        return f"{'https' if self.ca_file else 'http'}://{self.host}:{self.port}"

    async def open_connection(
        self, *, limit: int = netio.STREAM_LIMIT
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw connection to the agent (for upgrades passed on as bytes), with TLS over TCP."""
        if self.unix_socket:
            return await asyncio.open_unix_connection(self.unix_socket, limit=limit)
        context = self.ssl_context()
        return await asyncio.open_connection(
            self.host,
            self.port,
            ssl=context,
            server_hostname=self.host if context is not None else None,
            limit=limit,
        )


class NodeDialer(Protocol):
    def endpoint(self, node_name: str) -> NodeEndpoint | None:
        """The agent of `node_name` if this cluster owns that node and it runs; else None."""
