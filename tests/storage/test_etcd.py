"""EtcdBackend beyond the shared contract suite (test_sqlite.py runs that on etcd too):
settings, TLS, prefixes, etcd's own compaction, large values, ownership, and a replicated
3-member cluster losing a member and then its leader under write load."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import grpc
import grpc.aio
import pytest

from socialweb_computer import testing
from socialweb_computer.storage import base, contract, etcd


def unique_prefix() -> str:
    return f"/swc-test-{uuid.uuid4().hex[:12]}"


async def open_on(server: testing.EtcdCluster, **options: object) -> etcd.EtcdBackend:
    return await etcd.EtcdBackend.open(**{"prefix": unique_prefix(), **server.backend_options(), **options})


# -- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("urls", "message"),
    [
        ([], "as a list"),
        ("http://127.0.0.1:2379", "as a list"),
        (["127.0.0.1:2379"], "not an etcd client URL"),
        (["http://10.1.2.3:2379"], "plain HTTP to a host other than this one"),
        (["https://10.1.2.3:2379", "http://127.0.0.1:2379"], "mix of http"),
        (["https://etcd:99999"], "invalid port"),
    ],
)
def test_endpoint_errors_say_what_to_use(urls: object, message: str) -> None:
    with pytest.raises(etcd.ConfigError, match=message):
        etcd.parse_endpoints(urls)  # type: ignore[arg-type]


def test_endpoints_parse() -> None:
    parsed = etcd.parse_endpoints(
        ["https://etcd-0.example:2379", "https://[fd00::1]:2380", "https://10.0.0.2"]
    )
    assert [(e.target, e.tls) for e in parsed] == [
        ("etcd-0.example:2379", True),
        ("[fd00::1]:2380", True),
        ("10.0.0.2:2379", True),
    ]
    assert etcd.parse_endpoints(["http://localhost:2379"])[0].tls is False


@pytest.mark.parametrize("prefix", ["socialweb", "/socialweb/", "/a b", ""])
def test_prefix_errors(prefix: str) -> None:
    with pytest.raises(etcd.ConfigError, match="key prefix"):
        etcd.check_prefix(prefix)


async def test_tls_files_are_checked(tmp_path: Path) -> None:
    with pytest.raises(etcd.ConfigError, match="need https"):
        etcd.EtcdBackend(["http://127.0.0.1:2379"], ca_file=str(tmp_path / "ca.pem"))
    with pytest.raises(etcd.ConfigError, match="both certFile and keyFile"):
        etcd.EtcdBackend(["https://127.0.0.1:2379"], cert_file=str(tmp_path / "c.pem"))
    with pytest.raises(etcd.ConfigError, match="cannot read the etcd CA file"):
        etcd.EtcdBackend(["https://127.0.0.1:2379"], ca_file=str(tmp_path / "missing.pem"))


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(
    ("code", "details", "not_applied"),
    [
        (grpc.StatusCode.UNAVAILABLE, "etcdserver: no leader", True),
        (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: ...", True),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: too many requests", True),
        (grpc.StatusCode.UNAVAILABLE, "etcdserver: request timed out", False),
        (grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed", False),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", False),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", False),
    ],
)
def test_a_write_is_resent_only_when_it_certainly_did_not_apply(
    code: grpc.StatusCode, details: str, not_applied: bool
) -> None:
    error = rpc_error(code, details)
    assert etcd._transient(error)
    assert etcd._not_applied(error) is not_applied


async def test_unreachable_etcd_is_a_clear_error() -> None:
    port = testing.etcd._free_ports(1)[0]
    with pytest.raises(
        base.UnavailableError, match=rf"cannot reach etcd at http://127.0.0.1:{port}.*refused"
    ):
        await etcd.EtcdBackend.open([f"http://127.0.0.1:{port}"], request_timeout=0.5)


# -- one member -------------------------------------------------------------------------


async def test_prefixes_are_isolated(etcd_server: testing.EtcdCluster) -> None:
    a, b = await open_on(etcd_server), await open_on(etcd_server)
    try:
        watch = await b.watch("", after_revision=await b.current_revision())
        await a.create("/ci/core/pods/default/web", b"a")
        mine = await b.create("/ci/core/pods/default/web", b"b")
        assert [kv.value for kv in (await a.list("")).items] == [b"a"]
        assert await b.count("") == 1
        assert await contract.next_events(watch, 1) == [contract.put(mine.kv)]
        await contract.assert_no_event(watch)
        listed = etcd_server.etcdctl("get", "--prefix", a.prefix, "--keys-only").stdout.split()
        assert listed == [f"{a.prefix}/ci/core/pods/default/web"], "store keys sit under the prefix as is"
        watch.close()
    finally:
        await a.close()
        await b.close()


async def test_etcds_own_compaction(etcd_server: testing.EtcdCluster) -> None:
    async with await open_on(etcd_server) as b:
        first = await b.create("c/a", b"1")
        await b.update("c/a", b"2", expected_revision=first.kv.mod_revision)
        head = await b.current_revision()
        etcd_server.etcdctl("compaction", str(head))  # an operator, or another client, compacts
        error = await contract.expect_error(base.CompactedError, b.get("c/a", revision=first.kv.mod_revision))
        assert (error.requested, error.compacted) == (first.kv.mod_revision, head)  # type: ignore[attr-defined]
        assert await b.compacted_revision() == head
        await contract.expect_error(base.CompactedError, b.watch("c/", after_revision=head - 1))
        assert (await b.get("c/a", revision=head)) == await b.get("c/a")


async def test_a_watch_overtaken_by_compaction_while_behind_ends_with_compacted(
    etcd_server: testing.EtcdCluster,
) -> None:
    async with await open_on(etcd_server) as b:
        start = await b.current_revision()
        for i in range(3):
            await b.create(f"c/{i}", b"")
        watch = await b.watch("c/", after_revision=start)
        # Force the stream to be opened again after the history it needs is gone.
        watch._broken("test")  # type: ignore[attr-defined]
        await b.compact(await b.current_revision())
        await contract.expect_error(base.CompactedError, anext(aiter(watch)))


async def test_large_values_and_lists(etcd_server: testing.EtcdCluster) -> None:
    async with await open_on(etcd_server) as b:
        value = bytes(range(256)) * 4000  # 1 MiB: the size Kubernetes allows an object
        for i in range(6):
            await b.create(f"c/{i}", value)
        listed = await b.list("c/")  # 6 MiB in one response, past gRPC's default 4 MiB
        assert len(listed.items) == 6 and all(kv.value == value for kv in listed.items)


async def test_background_compaction_keeps_history_limit(etcd_server: testing.EtcdCluster) -> None:
    async with await open_on(etcd_server, history_limit=5, compact_interval=0.05) as b:
        for i in range(20):
            await b.create(f"c/{i}", b"")
        head = await b.current_revision()
        async with asyncio.timeout(10):
            while await b.compacted_revision() < head - 5:
                await asyncio.sleep(0.05)
        assert await b.compacted_revision() <= head - 5
        assert await b.count("c/") == 20


async def test_closed_backend_ends_watches_and_refuses_calls(etcd_server: testing.EtcdCluster) -> None:
    b = await open_on(etcd_server)
    watch = await b.watch("c/", after_revision=await b.current_revision())
    pending = asyncio.create_task(anext(aiter(watch)))
    await asyncio.sleep(0.05)
    await b.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 5)
    await contract.expect_error(base.StorageError, b.get("c/x"))


async def test_tls_with_client_certificates(tmp_path: Path) -> None:
    with testing.EtcdCluster.start(tmp_path / "etcd", tls=True, fsync=False) as server:
        async with await open_on(server) as b:
            assert (await b.create("c/x", b"secret")).kv.value == b"secret"
        no_cert = {**server.backend_options(), "cert_file": None, "key_file": None}
        with pytest.raises(base.UnavailableError, match="cannot reach etcd"):
            await etcd.EtcdBackend.open(prefix=unique_prefix(), request_timeout=1, **no_cert)  # type: ignore[arg-type]
        other_ca = testing.pki.generate(tmp_path / "other").serving_ca_file
        wrong_ca = {**server.backend_options(), "ca_file": str(other_ca)}
        with pytest.raises(base.UnavailableError, match="cannot reach etcd"):
            await etcd.EtcdBackend.open(prefix=unique_prefix(), request_timeout=1, **wrong_ca)  # type: ignore[arg-type]


# -- ownership --------------------------------------------------------------------------


async def test_one_owner_per_prefix(etcd_server: testing.EtcdCluster) -> None:
    prefix = unique_prefix()
    first = await open_on(etcd_server, prefix=prefix)
    second = await open_on(etcd_server, prefix=prefix)
    try:
        await first.claim_ownership(b"gateway pid 1 on host-a", ttl=5)
        error = await contract.expect_error(etcd.OwnershipError, second.claim_ownership(b"gateway 2", ttl=5))
        assert "owned by another process: gateway pid 1 on host-a" in str(error)
        assert "expires within" in str(error)
        await first.create("c/x", b"")  # the owner writes, fenced by its claim
        await first.close()  # releases the claim at once
        await second.claim_ownership(b"gateway 2", ttl=5)
        await second.create("c/y", b"")
    finally:
        await first.close()
        await second.close()


async def test_an_owner_that_lost_its_claim_cannot_write(etcd_server: testing.EtcdCluster) -> None:
    lost: list[str] = []
    async with await open_on(etcd_server) as b:
        await b.claim_ownership(b"me", ttl=5, on_lost=lost.append)
        written = await b.create("c/x", b"1")
        etcd_server.etcdctl("del", b.prefix + etcd.OWNER_KEY)  # as if its lease had expired
        error = await contract.expect_error(
            etcd.OwnershipError, b.update("c/x", b"2", expected_revision=written.kv.mod_revision)
        )
        assert "no longer owns" in str(error) and "nothing was written" in str(error)
        assert lost and await b.get("c/x") == written.kv


async def test_a_vanished_owner_is_replaced_after_its_lease_expires(etcd_server: testing.EtcdCluster) -> None:
    prefix = unique_prefix()
    gone = await open_on(etcd_server, prefix=prefix)
    await gone.claim_ownership(b"vanishes", ttl=2)
    assert gone._owner is not None
    gone._owner._task.cancel()  # it stops renewing without releasing, like a killed process
    gone._owner = None
    await gone.close()
    async with await open_on(etcd_server, prefix=prefix) as b:
        await contract.expect_error(etcd.OwnershipError, b.claim_ownership(b"next", ttl=2))
        async with asyncio.timeout(15):
            while True:
                try:
                    await b.claim_ownership(b"next", ttl=2)
                    break
                except etcd.OwnershipError:
                    await asyncio.sleep(0.2)


async def test_watch_and_claim_outlive_an_etcd_restart(tmp_path: Path) -> None:
    """The only member goes away and comes back: the watch, waiting meanwhile, delivers what
    is written afterwards, and the claim (its lease kept by etcd) still fences writes."""
    lost: list[str] = []
    with testing.EtcdCluster.start(tmp_path / "etcd") as server:
        async with await open_on(server, request_timeout=1) as b:
            await b.claim_ownership(b"me", ttl=10, on_lost=lost.append)
            before = await b.create("c/before", b"")
            watch = await b.watch("c/", after_revision=before.kv.mod_revision)
            pending = asyncio.create_task(anext(aiter(watch)))
            server.kill(0)
            with pytest.raises((base.UnavailableError, base.OutcomeUnknownError)):  # refused, or in flight
                await b.create("c/while-down", b"")
            await asyncio.sleep(1.0)  # the watch retries on a dead member meanwhile
            assert not pending.done()
            server.restart(0)
            server.wait_ready()
            async with asyncio.timeout(30):
                while True:
                    try:
                        after = await b.create("c/after", b"")
                        break
                    except base.UnavailableError:
                        await asyncio.sleep(0.1)
            assert await asyncio.wait_for(pending, 30) == contract.put(after.kv)
            assert not lost
            watch.close()


# -- a replicated cluster ---------------------------------------------------------------


class Writer:
    """Creates keys one after another and records what became of each write."""

    def __init__(self, backend: etcd.EtcdBackend) -> None:
        self.backend = backend
        self.acknowledged: dict[str, base.KeyValue] = {}
        self.refused: list[str] = []  # UnavailableError: certainly not applied
        self.unknown: list[str] = []  # OutcomeUnknownError: may or may not have been applied
        self.last_success = time.monotonic()
        self._stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            key = f"c/{i:06}"
            i += 1
            try:
                written = await self.backend.create(key, key.encode())
            except base.UnavailableError:
                self.refused.append(key)
                continue
            except base.OutcomeUnknownError:
                self.unknown.append(key)
                continue
            self.acknowledged[key] = written.kv
            self.last_success = time.monotonic()

    async def wait_for_success(self, timeout: float = 60.0) -> float:
        """Seconds from now until a write is acknowledged."""
        started = time.monotonic()
        count = len(self.acknowledged)
        async with asyncio.timeout(timeout):
            while len(self.acknowledged) == count:
                await asyncio.sleep(0.02)
        return time.monotonic() - started

    async def stop(self) -> None:
        self._stop.set()
        await self.task


async def test_member_then_leader_lost_under_write_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A follower dies, then the leader (quorum lost), then both come back: no acknowledged
    write is lost, no refused write appears, the watch sees each acknowledged write once."""
    with testing.EtcdCluster.start(tmp_path / "etcd", size=3) as cluster:
        backend = await etcd.EtcdBackend.open(cluster.endpoints, prefix=unique_prefix(), request_timeout=2)
        try:
            watch = await backend.watch("c/", after_revision=await backend.current_revision())
            seen: list[base.Event] = []
            reader = asyncio.create_task(contract._drain(watch, seen))
            writer = Writer(backend)
            await writer.wait_for_success()
            await asyncio.sleep(0.5)
            leader = cluster.leader_index()
            follower = next(i for i in range(3) if i != leader)
            cluster.kill(follower)
            after_follower = await writer.wait_for_success()
            await asyncio.sleep(0.5)
            cluster.kill(leader)  # one member of three left: no quorum
            with pytest.raises((base.UnavailableError, base.OutcomeUnknownError)):
                await backend.create("c/during-no-quorum", b"")
            await asyncio.sleep(1.0)
            cluster.restart(leader)
            cluster.restart(follower)
            recovery = await writer.wait_for_success()
            await asyncio.sleep(0.5)
            await writer.stop()

            stored = {kv.key: kv for kv in (await backend.list("c/")).items}
            acknowledged = writer.acknowledged
            lost = [key for key, kv in acknowledged.items() if stored.get(key) != kv]
            assert not lost, "an acknowledged write is lost"
            assert not [key for key in writer.refused if key in stored], "a refused write was applied"
            extra = set(stored) - set(acknowledged)
            assert extra <= set(writer.unknown) | {"c/during-no-quorum"}, "a write nobody made appeared"
            async with asyncio.timeout(30):
                while len(seen) < len(stored):
                    await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            assert [e.kv for e in seen] == sorted(stored.values(), key=lambda kv: kv.mod_revision), (
                "the watch missed or repeated an event"
            )
            watch.close()
            await reader
            with capsys.disabled():
                print(
                    f"\netcd fault test: {len(acknowledged)} writes acknowledged, "
                    f"{len(acknowledged)} of them found, {len(writer.refused)} refused while there was "
                    f"no quorum (none found), {len(writer.unknown)} with unknown outcome "
                    f"({len(extra & set(writer.unknown))} of them applied); writes resumed "
                    f"{after_follower:.2f}s after a follower died and {recovery:.2f}s after quorum "
                    f"returned; {len(seen)} watch events, none missing or repeated"
                )
        finally:
            await backend.close()
