"""Fixtures for gateway end-to-end tests: a real gateway process on a private state directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from socialweb_computer import testing
from socialweb_computer.testing import gateway as gateway_mod


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[object]:
    """Call with a spec dict; every gateway started is stopped after the test."""
    started: list[gateway_mod.GatewayProcess] = []

    def start(spec: dict | None = None, state: str = "state") -> gateway_mod.GatewayProcess:
        gateway = gateway_mod.GatewayProcess.start(tmp_path / state, spec)
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
