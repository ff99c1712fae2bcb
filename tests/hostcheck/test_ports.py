"""gateway-ports: a port taken by another process fails and names it; a port held by this state
directory's running gateway (the pid in gateway.json owns the listening socket) passes."""

from __future__ import annotations

import json
import os
import socket

import pytest

PORTS_FIX = ("stop the process that holds the port, or choose other ports in the gateway spec "
             "(listen.apiPort, listen.adminPort, listen.clusterPorts)")


@pytest.fixture
def other(host):
    """Another process listening on a loopback port: (its pid, the port)."""
    proc = host.listener()
    try:
        port = int(proc.stdout.readline())
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait()


def test_a_port_taken_by_another_process_fails_and_names_it(host, other) -> None:
    pid, port = other
    host.write_spec(listen={**host.spec["listen"], "apiPort": port})
    run = host.run("gateway")
    assert run.code == 1
    assert run.failed == {"gateway-ports"}
    run.line("gateway-ports", "FAIL", f"api 127.0.0.1:{port} is taken by pid {pid} (python", PORTS_FIX)
    run.line("gateway-ports", "FAIL", f"; admin 127.0.0.1:{host.spec['listen']['adminPort']} free", PORTS_FIX)


def test_ports_held_by_this_gateway_pass(host) -> None:
    with socket.socket() as api, socket.socket() as admin:
        for s in (api, admin):
            s.bind(("127.0.0.1", 0))
            s.listen()
        api_port, admin_port = api.getsockname()[1], admin.getsockname()[1]
        host.write_spec(listen={"apiPort": api_port, "adminPort": admin_port})
        record = {"pid": os.getpid(), "stateDir": str(host.state)}
        (host.state / "gateway.json").write_text(json.dumps(record))
        run = host.run("gateway")
    assert run.code == 0, run.out
    run.line("gateway-ports", "ok", f"api 127.0.0.1:{api_port} held by this gateway (pid {os.getpid()}); "
             f"admin 127.0.0.1:{admin_port} held by this gateway (pid {os.getpid()})")


def test_a_recorded_gateway_that_does_not_hold_the_port_does_not_excuse_it(host, other) -> None:
    pid, port = other
    host.write_spec(listen={**host.spec["listen"], "adminPort": port})
    (host.state / "gateway.json").write_text(json.dumps({"pid": os.getpid()}))
    run = host.run("gateway")
    assert run.code == 1
    run.line("gateway-ports", "FAIL", f"admin 127.0.0.1:{port} is taken by pid {pid} (", PORTS_FIX)


def test_a_tenant_cluster_port_taken_by_another_process_fails(host, other) -> None:
    pid, port = other
    for name, number in (("ci", port), ("docs", 0)):
        (host.state / "clusters" / name).mkdir(parents=True)
        (host.state / "clusters" / name / "cluster.json").write_text(
            json.dumps({"name": name, "uid": "u", "port": number, "url": f"https://127.0.0.1:{number}"}))
    run = host.run("gateway")
    assert run.code == 1
    run.line("gateway-ports", "FAIL", f"; cluster ci 127.0.0.1:{port} is taken by pid {pid} (", PORTS_FIX)
    run.line("gateway-ports", "FAIL", "; 1 cluster port free or held by this gateway")


def test_port_zero_and_free_cluster_ports_pass(host) -> None:
    host.write_spec(listen={**host.spec["listen"], "apiPort": 0})
    (host.state / "clusters" / "ci").mkdir(parents=True)
    (host.state / "clusters" / "ci" / "cluster.json").write_text(json.dumps({"name": "ci", "port": 0}))
    (host.state / "clusters" / "broken").mkdir()
    (host.state / "clusters" / "broken" / "cluster.json").write_text("{not json")
    run = host.run("gateway")
    assert run.code == 0, run.out
    run.line("gateway-ports", "ok", "api 127.0.0.1:0 is 0: the gateway picks a free port at start; admin ")
    run.line("gateway-ports", "ok", "; 1 cluster port free or held by this gateway")
