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
  single_file_binary  scripts/build-binary.sh's binary, built once per run and shared by
                    every worker (see below)

Which tests may run beside each other: scripts/test.sh runs the suite on pytest-xdist workers.
Session fixtures are then per worker (each worker starts its own shared_apiserver, etcd_server,
registries). Tests that touch host-global state get the marker `host` and run as two chains
(microVM tests, the rest), each on one worker, one test after another; every other module runs
whole on some worker. See `host_global` and SuiteScheduling below, and docs/testing.md.
"""

from __future__ import annotations

import dataclasses
import fcntl
import inspect
import json
import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

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


# --- Parallel runs: the `host` chains ---------------------------------------------------------
#
# Host-global state is what one test can see of another that runs at the same time: sandbox
# nodes, containerd, QEMU, network namespaces, links, nft rules, cgroups, accounts and their
# homes (a `HostSnapshot` compares all of that, so two node tests at once would each see the
# other's node as a leak). A test is `host` when any of these holds:
#   1. it lives under tests/<dir>/ for a dir in HOST_DIRS;
#   2. it is marked `host` (`pytestmark = pytest.mark.host` in its module, or on the test);
#   3. its module, or the module of any fixture it uses (a conftest's included), imports one of
#      HOST_HELPERS, the code that starts nodes or snapshots the host. This catches a new test
#      directory whose conftest starts nodes without anyone listing it.
# `pytest -m host` / `-m "not host"` select by it; `--collect-only -q -m host` lists them.
#
# Under pytest-xdist, SuiteScheduling (below) runs the `host` tests as two chains, each on ONE
# worker, one test after another, and every other module as a whole on whichever worker is free.
# The chains: tests/guest (QEMU microVMs), and every other `host` test (sandbox nodes, containerd,
# the deploy tests' accounts). They may run beside each other: what a microVM node has on the host
# is its processes and its directory (its namespaces have no name; it makes no host link, mount,
# nft rule or cgroup), and every check of either kind looks only at processes under its own state
# directory, or at what only the other kind makes.
HOST_GROUP = "host"
GUEST_CHAIN = "host:guest"
HOST_DIRS = ("node", "guest", "capacity", "net", "hostops")
HOST_HELPERS = frozenset({
    "socialweb_computer.testing.nodes",  # sandbox_node, HostSnapshot
    "socialweb_computer.bidders.sandbox",  # SandboxBidder: containerd, netns, nft, cgroups
    "socialweb_computer.bidders.qemu",  # microVMs
})
TESTS_ROOT = Path(__file__).resolve().parent
# workerinput key: the directory where each worker writes its `host` tests' node ids and chains.
GROUPS_DIR_KEY = "socialweb_host_groups_dir"
_helper_use: dict[int, bool] = {}


def _imports_host_helpers(namespace: Mapping[str, object]) -> bool:
    """Whether a module's globals hold a host helper module, or anything defined in one."""
    key = id(namespace)
    if key not in _helper_use:
        _helper_use[key] = any(
            (value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None))
            in HOST_HELPERS
            for value in list(namespace.values())
        )
    return _helper_use[key]


def _fixture_functions(item: pytest.Item) -> Iterable[object]:
    info = getattr(item, "_fixtureinfo", None)  # Function items only; pytest has no public accessor
    for definitions in (info.name2fixturedefs.values() if info else ()):
        for definition in definitions:
            yield inspect.unwrap(definition.func)


def host_global(item: pytest.Item) -> bool:
    """Whether `item` touches host-global state (the rule above)."""
    path = item.path.resolve()
    if path.is_relative_to(TESTS_ROOT) and path.relative_to(TESTS_ROOT).parts[0] in HOST_DIRS:
        return True
    if item.get_closest_marker(HOST_GROUP):
        return True
    module = getattr(item, "module", None)
    if module is not None and _imports_host_helpers(vars(module)):
        return True
    return any(_imports_host_helpers(getattr(func, "__globals__", {})) for func in _fixture_functions(item))


def host_chain(item: pytest.Item) -> str:
    """Which of the two chains a `host` test runs in (see above)."""
    path = item.path.resolve()
    guest = path.is_relative_to(TESTS_ROOT) and path.relative_to(TESTS_ROOT).parts[0] == "guest"
    return GUEST_CHAIN if guest else HOST_GROUP


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if host_global(item) and not item.get_closest_marker(HOST_GROUP):
            item.add_marker(pytest.mark.host)


# Fixtures that wait for the single-file binary (`single_file_binary`, below), directly or not.
BINARY_FIXTURES = frozenset({"single_file_binary", "agent_binary", "release"})


def _run_order(item: pytest.Item, slow_modules: set[Path]) -> tuple[int, int, int]:
    """Longest chains first: the `host` unit, then modules that hold slow tests, then the rest;
    within each, `run_first` tests before the others and `run_last` ones after them. In the
    `host` unit, tests that need the single-file binary come after the others: tests/packaging
    (slow, so early on another worker) builds it meanwhile, and the chain does not wait for it."""
    edge = 0 if item.get_closest_marker("run_first") else 2 if item.get_closest_marker("run_last") else 1
    if item.get_closest_marker(HOST_GROUP):
        return 0, edge, int(not BINARY_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())))
    return (1 if item.path in slow_modules else 2), edge, 0


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reports the collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    """Order the run (`_run_order`); on an xdist worker, tell the controller which node ids are
    `host`.

    xdist's own channel for groups (`xdist_group` marks, read back from a suffix it adds to node
    ids) does nothing on pytest 9.2 (pytest-xdist issue 1386), and the controller collects
    nothing itself; so each worker writes the ids into the directory the controller gave it,
    before it reports its collection, and SuiteScheduling reads them. Every worker orders the
    same collection the same way, so all of them report the same list.
    """
    slow_modules = {item.path for item in session.items if item.get_closest_marker("slow")}
    session.items.sort(key=lambda item: _run_order(item, slow_modules))
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None or GROUPS_DIR_KEY not in workerinput:
        return
    host = {item.nodeid: host_chain(item) for item in session.items if item.get_closest_marker(HOST_GROUP)}
    target = Path(workerinput[GROUPS_DIR_KEY]) / f"{workerinput['workerid']}.json"
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(host))
    partial.replace(target)


_groups_dir = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """On the xdist controller, before each worker starts: where it writes its `host` ids."""
    config = node.config
    if _groups_dir not in config.stash:
        config.stash[_groups_dir] = tempfile.mkdtemp(prefix="swc-xdist-groups-")
    node.workerinput[GROUPS_DIR_KEY] = config.stash[_groups_dir]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _groups_dir in config.stash:
        shutil.rmtree(config.stash[_groups_dir], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Every distributing mode (`-n N` alone means `--dist load`) becomes SuiteScheduling: no way
    of running the suite in parallel may put two tests of one `host` chain side by side."""
    if config.getvalue("dist") == "each":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SuiteScheduling(LoadFileScheduling):
        """One unit of work per test module, except that the `host` tests form two units, one
        per chain (`host_chain`).

        A module's tests stay on one worker, so its module fixtures (a server) start once, not
        once per worker. Units go out in the workers' order (`_run_order`): the `host` chains,
        the longest, start at once; a worker gets its next unit when at most two of its tests
        are left, so the workers that run the chains run nothing else until near their end.
        """

        def schedule(self) -> None:
            written = list(Path(config.stash[_groups_dir]).glob("*.json"))
            if not written:
                raise RuntimeError("no xdist worker said which tests are `host` (tests/conftest.py)")
            self.chains: dict[str, str] = {}  # node id of a `host` test -> its chain
            for path in written:
                self.chains.update(json.loads(path.read_text()))
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.chains.get(nodeid) or super()._split_scope(nodeid)

    config.option.loadscopereorder = False  # keep the workers' order
    return SuiteScheduling(config, log)


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


# --- The single-file binary, built once per run ------------------------------------------------
#
# tests/packaging runs it, tests/hostops deploys it, tests/guest puts it in the guest image as the
# agent. A PyInstaller build costs a minute or two of both cores, so every worker of a run shares
# one: the first to need it builds it under a lock in a directory all workers of the run see, and
# the others wait for that build and use its result (a failed build fails them with its output).
BUILD_SCRIPT = TESTS_ROOT.parent / "scripts" / "build-binary.sh"
BINARY_BUILD_TIMEOUT = 1500


@dataclasses.dataclass(frozen=True)
class BuiltBinary:
    path: Path  # dist/socialweb-computer, with its .sha256 beside it
    contents: Path  # the build's contents.txt (KIND<tab>NAME of what is bundled)
    commit: str | None  # HEAD when the build started (None outside git)


def _run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every worker of this run sees: the workers' base temporary directories share
    their parent (pytest-xdist), which belongs to this run alone; serially, the base itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _build_binary(root: Path) -> dict[str, Any]:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=TESTS_ROOT.parent, capture_output=True, text=True,
                          check=False)
    commit = head.stdout.strip() if head.returncode == 0 else None
    work = root / "work"
    # A private PyInstaller cache: another checkout's build at the same time cannot change it
    # under this one (a shared one ends in "bincache may be corrupted").
    env = {**os.environ, "PYINSTALLER_CONFIG_DIR": str(root / "pyinstaller")}
    try:
        command = ["bash", str(BUILD_SCRIPT), "--dist", str(root / "dist"), "--work", str(work)]
        result = subprocess.run(command, cwd=TESTS_ROOT.parent, env=env, capture_output=True, text=True,
                                timeout=BINARY_BUILD_TIMEOUT, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"build-binary.sh did not finish within {BINARY_BUILD_TIMEOUT} s"}
    if result.returncode != 0:
        return {"error": f"build-binary.sh failed ({result.returncode})\n--- stdout ---\n{result.stdout}\n"
                         f"--- stderr ---\n{result.stderr[-8000:]}"}
    # Keep the list of contents; PyInstaller's intermediate files are hundreds of MiB.
    for entry in work.iterdir():
        if entry.name != "contents.txt":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    shutil.rmtree(root / "pyinstaller", ignore_errors=True)
    return {"commit": commit}


@pytest.fixture(scope="session")
def single_file_binary(tmp_path_factory: pytest.TempPathFactory) -> BuiltBinary:
    """socialweb-computer built by scripts/build-binary.sh, once per run (see above)."""
    root = _run_directory(tmp_path_factory) / "single-file-binary"
    root.mkdir(exist_ok=True)
    outcome = root / "outcome.json"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not outcome.exists():
            outcome.write_text(json.dumps(_build_binary(root)))
        built = json.loads(outcome.read_text())
    if "error" in built:
        pytest.fail(built["error"], pytrace=False)
    return BuiltBinary(root / "dist" / "socialweb-computer", root / "work" / "contents.txt", built["commit"])
