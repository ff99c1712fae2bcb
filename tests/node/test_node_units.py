"""The agent's pure parts, by table: status, environment, CRI configs, logs, images, forwarding."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from socialweb_computer.node import envvars, hostports, logs, oci, pleg, podspec, podstatus, probes

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"a": "1"}},
    "spec": {"restartPolicy": "Always", "containers": [{"name": "c", "image": "i"}]},
}


def _instance(name: str, attempt: int, state: int, exit_code: int = 0, reason: str = "") -> pleg.Instance:
    return pleg.Instance(
        id=f"{name}-{attempt}",
        name=name,
        attempt=attempt,
        sandbox_id="s",
        state=state,
        created_at=attempt + 1,
        started_at=10**18,
        finished_at=10**18 + 10**9 if state == pleg.EXITED else 0,
        exit_code=exit_code,
        reason=reason,
        message="",
        image="img",
        image_ref="ref",
        log_path="",
        annotations={},
        mounts=(),
    )


def _view(**changes: object) -> podstatus.WorkerView:
    view = podstatus.WorkerView(
        waiting={},
        ready={},
        started={},
        has_readiness=set(),
        has_startup=set(),
        pod_ip="10.244.0.5",
        host_ip="10.0.2.100",
        start_time="2026-01-01T00:00:00Z",
        sandbox_ready=True,
    )
    for key, value in changes.items():
        setattr(view, key, value)
    return view


@pytest.mark.parametrize(
    ("policy", "exit_code", "waiting", "phase"),
    [
        ("Always", 0, None, "Running"),
        ("Never", 0, None, "Succeeded"),
        ("Never", 1, None, "Failed"),
        ("OnFailure", 0, None, "Succeeded"),
        ("OnFailure", 1, ("CrashLoopBackOff", "back-off"), "Running"),
        ("Always", 1, ("CrashLoopBackOff", "back-off"), "Running"),
    ],
)
def test_phase_of_an_ended_container_follows_the_restart_policy(policy, exit_code, waiting, phase) -> None:
    pod = {**POD, "spec": {**POD["spec"], "restartPolicy": policy}}
    record = pleg.PodRecord(instances=[_instance("c", 0, pleg.EXITED, exit_code)])
    status = podstatus.pod_status(pod, record, _view(waiting={"c": waiting} if waiting else {}), {})
    assert status["phase"] == phase


def test_a_waiting_container_keeps_its_last_termination_and_restart_count() -> None:
    record = pleg.PodRecord(
        instances=[_instance("c", 2, pleg.EXITED, 3, "Error"), _instance("c", 1, pleg.EXITED, 3, "Error")]
    )
    status = podstatus.pod_status(POD, record, _view(waiting={"c": ("CrashLoopBackOff", "back-off 20s")}), {})
    container = status["containerStatuses"][0]
    assert container["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}}
    assert container["lastState"]["terminated"]["exitCode"] == 3
    assert container["restartCount"] == 2
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ContainersNotReady")
    assert ready["message"] == "containers with unready status: [c]"


def test_readiness_gates_and_foreign_conditions_are_kept() -> None:
    pod = {
        **POD,
        "spec": {**POD["spec"], "readinessGates": [{"conditionType": "example.com/ok"}]},
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }
    record = pleg.PodRecord(instances=[_instance("c", 0, pleg.RUNNING)])
    status = podstatus.pod_status(pod, record, _view(), {})
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["PodScheduled"]["status"] == "True"
    assert conditions["ContainersReady"]["status"] == "True"
    assert conditions["Ready"]["reason"] == "ReadinessGatesNotReady"
    assert (
        conditions["Ready"]["message"]
        == 'corresponding condition of pod readiness gate "example.com/ok" does '
        "not exist."
    )


def test_init_containers_hold_the_pod_in_pending() -> None:
    pod = {**POD, "spec": {**POD["spec"], "initContainers": [{"name": "i", "image": "x"}]}}
    record = pleg.PodRecord(instances=[_instance("i", 0, pleg.RUNNING)])
    status = podstatus.pod_status(pod, record, _view(), {})
    assert status["phase"] == "Pending"
    assert status["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"
    initialized = {c["type"]: c for c in status["conditions"]}["Initialized"]
    assert initialized["message"] == "containers with incomplete status: [i]"


@pytest.mark.parametrize(
    ("text", "env", "expanded"),
    [
        ("$(A)-$(B)", {"A": "1"}, "1-$(B)"),
        ("$$(A)", {"A": "1"}, "$(A)"),
        ("a$b", {}, "a$b"),
        ("$(A", {"A": "1"}, "$(A"),
    ],
)
def test_variable_expansion_is_kubernetes_own(text, env, expanded) -> None:
    assert envvars.expand(text, env) == expanded


def test_resource_field_refs_round_up_and_default_to_allocatable() -> None:
    container = {"resources": {"limits": {"cpu": "250m", "memory": "64Mi"}}}
    assert envvars.resource_value(container, "limits.cpu", None, {}) == "1"
    assert envvars.resource_value(container, "limits.cpu", "1m", {}) == "250"
    assert envvars.resource_value(container, "limits.memory", "1Mi", {}) == "64"
    assert envvars.resource_value({}, "limits.memory", None, {"memory": "1Gi"}) == str(1 << 30)


def test_qos_class_and_oom_scores() -> None:
    guaranteed = {
        **POD,
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]},
    }
    burstable = {
        **POD,
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"memory": "512Mi"}}}]},
    }
    assert podspec.qos_class(POD) == "BestEffort"
    assert podspec.qos_class(guaranteed) == "Guaranteed"
    assert podspec.qos_class(burstable) == "Burstable"
    assert podspec.oom_score_adj(guaranteed, guaranteed["spec"]["containers"][0], 2 << 30) == -997
    assert podspec.oom_score_adj(burstable, burstable["spec"]["containers"][0], 2 << 30) == 750
    resources = podspec.container_resources(guaranteed, guaranteed["spec"]["containers"][0], 2 << 30)
    assert (resources.cpu_shares, resources.cpu_quota, resources.cpu_period) == (1024, 100000, 100000)
    assert resources.memory_limit_in_bytes == 1 << 30


def test_cluster_first_without_cluster_dns_falls_back_to_the_node_resolv_conf(tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 10.0.2.3\nsearch example.test\noptions edns0\n")
    settings = podspec.NodeSettings("n", "/socialweb/n", tmp_path, 1 << 30, str(resolv))
    assert podspec.effective_dns_policy(POD, settings) == ("Default", True)
    dns = podspec.dns_config(POD, settings)
    assert (list(dns.servers), list(dns.searches), list(dns.options)) == (
        ["10.0.2.3"],
        ["example.test"],
        ["edns0"],
    )
    with_dns = podspec.NodeSettings(
        "n", "/socialweb/n", tmp_path, 1 << 30, str(resolv), cluster_dns=("10.96.0.10",)
    )
    dns = podspec.dns_config(POD, with_dns)
    assert list(dns.searches)[:3] == ["ns.svc.cluster.local", "svc.cluster.local", "cluster.local"]
    assert list(dns.options) == ["ndots:5"]


def test_cri_log_records_are_joined_filtered_and_followed(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    path.write_bytes(
        b"2026-12-01T10:00:00.000000001Z stdout P part-\n"
        b"2026-12-01T10:00:00.5Z stdout F one\n"
        b"2026-12-01T10:00:01Z stderr F two\n"
        b"2026-12-01T10:00:02Z stdout F three\n"
    )

    async def collect(options: logs.Options) -> bytes:
        return b"".join([c async for c in logs.read(path, options, running=lambda: False)])

    assert asyncio.run(collect(logs.Options())) == b"part-one\ntwo\nthree\n"
    assert asyncio.run(collect(logs.Options(tail_lines=1))) == b"three\n"
    since = datetime.datetime(2026, 12, 1, 10, 0, 1, tzinfo=datetime.UTC)
    assert asyncio.run(collect(logs.Options(since=since))) == b"two\nthree\n"
    assert asyncio.run(collect(logs.Options(limit_bytes=5))) == b"part-"
    assert (
        asyncio.run(collect(logs.Options(timestamps=True, tail_lines=1))) == b"2026-12-01T10:00:02Z three\n"
    )


def test_an_oci_image_is_deterministic(tmp_path: Path) -> None:
    def build() -> str:
        image = oci.Image(entrypoint=["/x"])
        image.add_file("x", b"#!/bin/sh\n", mode=0o755)
        image.add_symlink("bin/sh", "/x")
        return image.write_archive(tmp_path / "a.tar", "localhost/t:1")

    assert build() == build()


def test_host_ports_forward_bytes_both_ways(tmp_path: Path) -> None:
    async def scenario() -> bytes:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.read(100))
            await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        on_host = await hostports.serve_on_host([port], tmp_path / "sockets")
        assert oct((tmp_path / "sockets" / f"{port}.sock").stat().st_mode & 0o777) == "0o600"
        reader, writer = await asyncio.open_unix_connection(str(tmp_path / "sockets" / f"{port}.sock"))
        writer.write(b"ping")
        await writer.drain()
        answer = await reader.read(100)
        writer.close()
        for server in [upstream, *on_host]:
            server.close()
        return answer

    assert asyncio.run(scenario()) == b"ping"


def test_grpc_probes_ask_the_standard_health_service() -> None:
    async def scenario() -> list[tuple[bool, str]]:
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer() if hasattr(health, "aio") else None
        if servicer is None:
            from grpc_health.v1 import _async as health_async

            servicer = health_async.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await servicer.set("down", health_pb2.HealthCheckResponse.NOT_SERVING)
        results = [
            await probes.run_handler(
                {"grpc": {"port": port}},
                runtime=None,
                container_id="",
                container={},
                pod_ip="127.0.0.1",
                timeout=2,
            ),
            await probes.run_handler(
                {"grpc": {"port": port, "service": "down"}},
                runtime=None,
                container_id="",
                container={},
                pod_ip="127.0.0.1",
                timeout=2,
            ),
        ]
        await server.stop(None)
        return results

    serving, down = asyncio.run(scenario())
    assert serving == (True, "")
    assert down == (False, 'service unhealthy (responded with "NOT_SERVING")')


def test_tcp_and_http_probe_failures_read_like_a_kubelet() -> None:
    async def scenario() -> tuple[tuple[bool, str], tuple[bool, str]]:
        tcp = await probes.run_handler(
            {"tcpSocket": {"port": 1}},
            runtime=None,
            container_id="",
            container={},
            pod_ip="127.0.0.1",
            timeout=1,
        )
        http = await probes.run_handler(
            {"httpGet": {"port": 1, "path": "/healthz"}},
            runtime=None,
            container_id="",
            container={},
            pod_ip="127.0.0.1",
            timeout=1,
        )
        return tcp, http

    tcp, http = asyncio.run(scenario())
    assert tcp == (False, "dial tcp 127.0.0.1:1: connect: connection refused")
    assert http == (
        False,
        'Get "http://127.0.0.1:1/healthz": dial tcp 127.0.0.1:1: connect: connection refused',
    )


def test_logs_rotate_past_the_size_limit_and_keep_a_bounded_number(tmp_path: Path) -> None:
    reopened: list[str] = []

    async def reopen(container_id: str) -> None:
        reopened.append(container_id)
        (tmp_path / "0.log").write_bytes(b"")  # containerd starts a new file

    rotator = logs.Rotator(reopen, max_size=100, max_files=3)
    path = tmp_path / "0.log"

    async def scenario() -> list[bool]:
        results = []
        for _ in range(5):
            path.write_bytes(b"x" * 150)
            results.append(await rotator.rotate("c1", path))
            await asyncio.sleep(0.001)
        path.write_bytes(b"small")
        results.append(await rotator.rotate("c1", path))
        return results

    assert asyncio.run(scenario()) == [True] * 5 + [False]
    assert reopened == ["c1"] * 5
    assert len(list(tmp_path.glob("0.log.*"))) == 2  # with the live file: max_files
