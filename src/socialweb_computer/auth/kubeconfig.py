"""Kubeconfig files with embedded credentials (written 0600)."""

from __future__ import annotations

import base64

import yaml

from socialweb_computer.auth import pki


def render(*, cluster: str, server: str, ca_pem: bytes, user: str, cert_pem: bytes, key_pem: bytes) -> bytes:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": cluster, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)},
            }
        ],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False).encode()


def write(path: str, *, sync: bool = True, **kwargs: object) -> None:
    pki.write_private(path, render(**kwargs), sync=sync)  # type: ignore[arg-type]
