"""An asyncio client for one cluster's Kubernetes API, over HTTPS with a client certificate.

The node agent reaches its cluster only through this (like a kubelet through client-go):
JSON requests, the four patch types, watch streams, and `ApiError` carrying the server's
`Status`. It shares no code with the API server; what it knows of the server is what any
client knows.

    client = Client(Credentials.from_files(server, ca, cert, key), user_agent="kubelet/v1.37.0")
    node = await client.get("/api/v1/nodes/n1")
    async for event in client.watch("/api/v1/pods", {"fieldSelector": "spec.nodeName=n1"}):
        ...
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import ssl
import tempfile
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

Object = dict[str, Any]

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class ApiError(Exception):
    """The server answered with an error: `status` is the HTTP code, `body` its Status (or text)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"{status}: {message}")

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", "")) if isinstance(self.body, dict) else ""

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


@dataclasses.dataclass(frozen=True)
class Credentials:
    server: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def from_files(cls, server: str, ca: str | Path, cert: str | Path, key: str | Path) -> Credentials:
        return cls(server, Path(ca).read_bytes(), Path(cert).read_bytes(), Path(key).read_bytes())

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        # The ssl module loads client keys only from files: a private directory, removed at once.
        directory = tempfile.mkdtemp(prefix="client-")
        try:
            cert, key = Path(directory, "cert.pem"), Path(directory, "key.pem")
            cert.write_bytes(self.cert_pem)
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(self.key_pem)
            context.load_cert_chain(str(cert), str(key))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return context


def path_of(api_version: str, plural: str, namespace: str = "", name: str = "", subresource: str = "") -> str:
    """`/api/v1/namespaces/ns/pods/p/status` from its parts (names quoted)."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{urllib.parse.quote(namespace, safe='')}"
    base += f"/{plural}"
    if name:
        base += f"/{urllib.parse.quote(name, safe='')}"
    if subresource:
        base += f"/{subresource}"
    return base


class Client:
    def __init__(self, credentials: Credentials, *, user_agent: str, connections: int = 16) -> None:
        self.credentials = credentials
        self.user_agent = user_agent
        self._base = credentials.server.rstrip("/")
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.credentials.ssl_context(), limit=self._connections)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, content_type: str = "") -> dict[str, str]:
        headers = {"Accept": JSON, "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = JSON,
        timeout: float = 30.0,
    ) -> Any:
        data = None if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
        session = self._open()
        async with session.request(
            method,
            self._base + path,
            params=params,
            data=data,
            headers=self._headers(content_type if data is not None else ""),
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            raw = await response.read()
            status = response.status
        try:
            decoded = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            decoded = raw.decode(errors="replace")
        if status >= 400:
            raise ApiError(status, decoded)
        return decoded

    async def get(self, path: str, *, params: dict[str, str] | None = None) -> Any:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, obj: Object) -> Any:
        return await self.request("POST", path, obj)

    async def update(self, path: str, obj: Object) -> Any:
        return await self.request("PUT", path, obj)

    async def patch(
        self, path: str, patch: Any, *, content_type: str = MERGE_PATCH, params: dict[str, str] | None = None
    ) -> Any:
        return await self.request("PATCH", path, patch, content_type=content_type, params=params)

    async def delete(self, path: str, options: Object | None = None) -> Any:
        return await self.request("DELETE", path, options)

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Object]:
        """Events of one watch request until the server ends it; an ERROR event raises ApiError."""
        session = self._open()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
        async with session.get(
            self._base + path, params={**params, "watch": "true"}, headers=self._headers(), timeout=timeout
        ) as response:
            if response.status >= 400:
                raw = await response.read()
                try:
                    body = orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    body = raw.decode(errors="replace")
                raise ApiError(response.status, body)
            # Lines are split by hand: aiohttp's readline refuses lines over 128 KiB (large objects).
            pending = b""
            async for chunk in response.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise ApiError(int(status.get("code") or 500), status)
                    yield event
