"""Suite-wide fixtures: a real apiserver process, reached with the pinned kubectl.

Why here: most component suites end in an end-to-end check against the real server, and
they must all start, wait for, and tear it down the same way (socialweb_computer.testing).
Nothing is skipped silently: a missing .tools/bin/kubectl fails the test that needs it and
says how to install it.

Fixtures:
  apiserver         function scope, a fresh server on its own state dir (for tests that write
                    cluster-wide state, restart the server, or kill it)
  shared_apiserver  session scope, one server for read-mostly tests; each test must keep to its
                    own namespace, see `namespace`
  namespace         a fresh namespace on shared_apiserver, unique per test
  storage           which store those servers use: "sqlite", or "etcd" (a real etcd member on
                    loopback, `etcd_server`, one key prefix per server). $SOCIALWEB_TEST_STORAGE
                    sets it for every test; a module marked `both_storages` runs on both.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from socialweb_computer import testing
from socialweb_computer.testing import server as server_module

STORAGE_ENV = "SOCIALWEB_TEST_STORAGE"
STORAGES = ("sqlite", "etcd")


def pytest_configure(config: pytest.Config) -> None:
    # Tests that shell out to plain `kubectl`/`helm` must get the pinned ones, never /usr/bin's.
    tools_bin = str(server_module.TOOLS_BIN)
    path = os.environ.get("PATH", "").split(os.pathsep)
    if not path or path[0] != tools_bin:
        os.environ["PATH"] = os.pathsep.join([tools_bin, *path])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "storage" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_storages"):
        metafunc.parametrize("storage", STORAGES, indirect=True, scope="session")


def default_storage() -> str:
    chosen = os.environ.get(STORAGE_ENV, "sqlite")
    if chosen not in STORAGES:
        raise pytest.UsageError(f"${STORAGE_ENV}={chosen!r}: use one of {', '.join(STORAGES)}")
    return chosen


@pytest.fixture(scope="session")
def storage(request: pytest.FixtureRequest) -> str:
    """The store test servers use (see the module docstring)."""
    return str(getattr(request, "param", default_storage()))


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[testing.EtcdCluster]:
    """One etcd member for the session; nothing crashes it, so it may skip fsync."""
    with testing.EtcdCluster.start(tmp_path_factory.mktemp("etcd"), fsync=False) as cluster:
        yield cluster


def store_args(storage: str, request: pytest.FixtureRequest) -> list[str]:
    """`apiserver` arguments that put a new server on `storage` (its own etcd key prefix)."""
    if storage != "etcd":
        return []
    cluster: testing.EtcdCluster = request.getfixturevalue("etcd_server")
    prefix = f"/swc-test-{uuid.uuid4().hex[:12]}"
    return ["--etcd-servers", ",".join(cluster.endpoints), "--etcd-prefix", prefix]


def _require_tools() -> None:
    try:
        testing.tool_path("kubectl")
    except testing.ToolMissingError as exc:
        pytest.fail(str(exc), pytrace=False)


def _finish(server: testing.ApiServerProcess, what: str) -> None:
    """Stop the server; a server that died during the test, or logged a traceback, fails it."""
    died = server.returncode
    server.stop()
    if died is not None:
        pytest.fail(f"{what} exited with {died} during the test\n{server.logs()}", pytrace=False)
    tracebacks = testing.logged_tracebacks(server)
    if tracebacks:
        pytest.fail(f"{what} logged {len(tracebacks)} traceback(s); the first:\n{tracebacks[0]}",
                    pytrace=False)


@pytest.fixture
def apiserver(
    tmp_path: Path, storage: str, request: pytest.FixtureRequest
) -> Iterator[testing.ApiServerProcess]:
    """A fresh apiserver on tmp_path/state, stopped after the test."""
    _require_tools()
    server = testing.ApiServerProcess.start(tmp_path / "state", extra_args=store_args(storage, request))
    yield server
    _finish(server, "apiserver")


@pytest.fixture(scope="session")
def shared_apiserver(tmp_path_factory: pytest.TempPathFactory, storage: str,
                     request: pytest.FixtureRequest) -> Iterator[testing.ApiServerProcess]:
    """One apiserver for the whole session (one per store); use `namespace` to keep tests apart."""
    _require_tools()
    server = testing.ApiServerProcess.start(tmp_path_factory.mktemp(f"shared-apiserver-{storage}") / "state",
                                            extra_args=store_args(storage, request))
    yield server
    _finish(server, "shared apiserver")


@pytest.fixture
def namespace(shared_apiserver: testing.ApiServerProcess, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace created for this test on the shared server, deleted (without waiting) after it."""
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{stem or 't'}-{uuid.uuid4().hex[:6]}"
    shared_apiserver.kubectl("create", "namespace", name)
    yield name
    if shared_apiserver.returncode is None:
        shared_apiserver.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found",
                                 check=False)
