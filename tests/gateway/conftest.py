"""Fixtures for gateway end-to-end tests: a real gateway process on a private state directory.

On the `etcd` storage (tests/conftest.py) every gateway a test starts shares one etcd key
prefix of the session's etcd member, so a restart finds the same store.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer import testing
from socialweb_computer.testing import gateway as gateway_mod


def etcd_storage(cluster: testing.EtcdCluster, prefix: str | None = None) -> dict[str, Any]:
    """The spec's `storage` section that puts a gateway on `cluster`."""
    settings: dict[str, Any] = {"endpoints": cluster.endpoints,
                                "keyPrefix": prefix or f"/swc-test-{uuid.uuid4().hex[:12]}"}
    if cluster.pki is not None:
        settings.update(caFile=str(cluster.pki.serving_ca_file), certFile=str(cluster.pki.client_cert_file),
                        keyFile=str(cluster.pki.client_key_file))
    return {"backend": "etcd", "etcd": settings}


@pytest.fixture
def gateway_workers(request: pytest.FixtureRequest) -> int:
    """The spec's `workers` for gateways `start_gateway` starts (parametrize it indirectly for more)."""
    return int(getattr(request, "param", 1))


@pytest.fixture
def start_gateway(tmp_path: Path, storage: str, gateway_workers: int,
                  request: pytest.FixtureRequest) -> Iterator[object]:
    """Call with a spec dict; every gateway started is stopped after the test."""
    started: list[gateway_mod.GatewayProcess] = []
    store: dict[str, Any] | None = None
    if storage == "etcd":
        store = etcd_storage(request.getfixturevalue("etcd_server"))

    def start(spec: dict | None = None, state: str = "state",
              timeout: float = 30.0) -> gateway_mod.GatewayProcess:
        # (None means "the spec file this state directory was started with", if there is one.)
        if spec is None and not (tmp_path / f"{state}.spec.yaml").exists():
            spec = {}
        if spec is not None and "workers" not in spec:
            spec = {**spec, "workers": gateway_workers}
        if store is not None and spec is not None and "storage" not in spec:
            spec = {**spec, "storage": store}
        if spec is not None and spec.get("workers", 1) != 1:
            timeout = max(timeout, 120.0)  # each worker loads an interpreter and the package first
        gateway = gateway_mod.GatewayProcess.start(tmp_path / state, spec, timeout=timeout)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()
    for gateway in started:
        tracebacks = testing.logged_tracebacks(gateway)
        if tracebacks:
            pytest.fail(f"the gateway logged {len(tracebacks)} traceback(s); the first:\n{tracebacks[0]}",
                        pytrace=False)
