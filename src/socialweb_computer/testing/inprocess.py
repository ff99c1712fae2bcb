"""The API engine in the test's own process, for tests that need to change a limit or an interval.

`InProcessServer.start(directory, **storage_options)` serves a LogicalCluster on an in-memory
store behind the real listener and middlewares (mTLS with a throwaway PKI from `pki`, the
client in system:masters) on a free loopback port, with an aiohttp session that reaches it.
Module-level limits (page sizes, intervals) can be patched by the test, since the server runs
on its event loop. Tests that need no such change use `ApiServerProcess`, the real process.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from socialweb_computer.apiserver import app as app_mod
from socialweb_computer.apiserver.cluster import LogicalCluster
from socialweb_computer.auth import authn
from socialweb_computer.storage import memory
from socialweb_computer.testing import pki

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


@dataclass
class InProcessServer:
    url: str
    port: int
    context: ssl.SSLContext
    session: aiohttp.ClientSession
    cluster: LogicalCluster
    backend: memory.MemoryBackend
    _runner: web.AppRunner

    @classmethod
    async def start(cls, directory: Path, *, name: str = "test", **storage_options: Any) -> InProcessServer:
        backend = await memory.MemoryBackend.open(**storage_options)
        cluster = LogicalCluster(name, backend)
        await cluster.start()
        local = pki.generate(directory)
        authenticator = authn.ClientCertAuthenticator.from_pem_file(str(local.client_ca_file))
        runner, port = await app_mod.serve(app_mod.build_app(cluster, authenticator=authenticator),
                                           host="127.0.0.1", port=0, ssl_context=local.server_ssl_context())
        context = local.client_ssl_context()
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=200))
        return cls(f"https://127.0.0.1:{port}", port, context, session, cluster, backend, runner)

    async def stop(self) -> None:
        await self.session.close()
        await self._runner.cleanup()
        await self.cluster.close()
        await self.backend.close()

    async def call(self, method: str, path: str, body: Any = None, **headers: str) -> Any:
        """A request whose answer must be a success; returns the decoded JSON body."""
        data = orjson.dumps(body) if body is not None else None
        async with self.session.request(method, self.url + path, data=data,
                                        headers={"Content-Type": "application/json", **headers}) as r:
            answer = await r.read()
            assert r.status < 300, answer
            return orjson.loads(answer)

    async def create(self, name: str, data: str = "x", labels: dict[str, str] | None = None) -> Any:
        """A ConfigMap in `default`."""
        meta: dict[str, Any] = {"name": name}
        if labels:
            meta["labels"] = labels
        return await self.call("POST", CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                                                    "data": {"v": data}})
