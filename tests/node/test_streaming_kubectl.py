"""Logs, exec, attach, port-forward, cp, debug, proxy and run --rm -i through the tenant apiserver,
with the real kubectl in its default mode (WebSocket first) and with SPDY forced.

The node is the shared sandbox node of conftest.py; every test has its own namespace.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer.testing import server as server_mod

MODES = {
    "websocket": {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "true", "KUBECTL_PORT_FORWARD_WEBSOCKETS": "true"},
    "spdy": {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false", "KUBECTL_PORT_FORWARD_WEBSOCKETS": "false"},
}


def _kubectl(
    tenant: Any, *args: str, mode: str = "websocket", input: str | bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    env = {**tenant.gateway.tool_env(), **MODES[mode]}
    return subprocess.run(
        [str(server_mod.tool_path("kubectl")), f"--kubeconfig={tenant.kubeconfig}", *args],
        input=input.encode() if isinstance(input, str) else input,
        capture_output=True,
        env=env,
        timeout=timeout,
    )


def _sleeper(tenant: Any, ns: str, image: str, name: str = "box", **extra: Any) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
                    **extra,
                }
            ],
        },
    }
    tenant.apply(json.dumps(pod), ns)
    tenant.wait(
        lambda: (
            "running" in (tenant.pod(name, ns)["status"].get("containerStatuses") or [{}])[0].get("state", {})
        ),
        f"{name} running",
    )


@pytest.fixture
def box(tenant: Any, ns: str, image: str) -> str:
    _sleeper(tenant, ns, image)
    return ns


@pytest.mark.parametrize("mode", sorted(MODES))
def test_exec_exit_codes_streams_and_errors(tenant, box, mode) -> None:
    done = _kubectl(
        tenant, "exec", "box", "-n", box, "--", "sh", "-c", "echo out; echo err >&2; exit 3", mode=mode
    )
    assert done.returncode == 3
    assert done.stdout == b"out\n"
    assert b"err\n" in done.stderr and b"command terminated with exit code 3" in done.stderr
    assert _kubectl(tenant, "exec", "box", "-n", box, "--", "true", mode=mode).returncode == 0
    assert (
        _kubectl(tenant, "exec", "box", "-n", box, "--", "sh", "-c", "kill -9 $$", mode=mode).returncode
        == 137
    )
    missing = _kubectl(tenant, "exec", "box", "-n", box, "--", "/nonexistent", mode=mode)
    assert missing.returncode == 1
    assert b"no such file or directory" in missing.stderr


@pytest.mark.parametrize("mode", sorted(MODES))
def test_exec_stdin_round_trips_bytes(tenant, box, mode) -> None:
    data = os.urandom(8 << 20)
    done = _kubectl(tenant, "exec", "-i", "box", "-n", box, "--", "sha256sum", mode=mode, input=data)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    out = _kubectl(
        tenant, "exec", "box", "-n", box, "--", "head", "-c", str(16 << 20), "/dev/zero", mode=mode
    )
    assert hashlib.sha256(out.stdout).hexdigest() == hashlib.sha256(bytes(16 << 20)).hexdigest()


def test_default_mode_succeeds_on_its_first_upgrade(tenant, box) -> None:
    done = _kubectl(tenant, "-v=6", "exec", "box", "-n", box, "--", "echo", "first")
    assert done.returncode == 0 and done.stdout == b"first\n"
    log = done.stderr.decode()
    assert 'Subprotocol negotiated" protocol="v5.channel.k8s.io"' in log
    upgrades = [line for line in log.splitlines() if "/exec?" in line and '"Response"' in line]
    assert len(upgrades) == 1 and "101 Switching Protocols" in upgrades[0], upgrades
    assert "fallback" not in log.lower()


@pytest.mark.parametrize("mode", sorted(MODES))
def test_attach_with_stdin(tenant, ns, image, mode) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "echoer"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "stdin": True,
                    "command": ["sh", "-c", 'while read l; do echo "got: $l"; echo "err: $l" >&2; done'],
                }
            ],
        },
    }
    tenant.apply(json.dumps(pod), ns)
    tenant.wait(
        lambda: "running" in tenant.pod("echoer", ns)["status"]["containerStatuses"][0]["state"], "running"
    )
    # stdin stays open a moment: closing it detaches (the container has no stdinOnce), as upstream.
    env = {**tenant.gateway.tool_env(), **MODES[mode]}
    done = subprocess.run(
        [
            "sh",
            "-c",
            f"(printf 'line1\\nline2\\n'; sleep 2) | {server_mod.tool_path('kubectl')} "
            f"--kubeconfig={tenant.kubeconfig} attach -i echoer -n {ns}",
        ],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert b"got: line1\ngot: line2\n" in done.stdout
    assert b"err: line1" in done.stderr


class Terminal:
    """kubectl in a real terminal (a detached tmux session), read back from the screen."""

    def __init__(self, tenant: Any, name: str, command: str, mode: str) -> None:
        if shutil.which("tmux") is None:
            pytest.skip("tmux is not installed (scripts/bootstrap.sh --test installs it)")
        self.tenant, self.name = tenant, name
        self.rc = Path(f"{tenant.gateway.state_dir}/{name}.rc")
        kubectl = f"{server_mod.tool_path('kubectl')} --kubeconfig={tenant.kubeconfig}"
        line = f"{kubectl} {command}; echo rc=$? > {self.rc}"
        env = {**tenant.gateway.tool_env(), **MODES[mode]}
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", name, "-x", "100", "-y", "30", line], env=env, check=True
        )

    def screen(self) -> str:
        capture = ["tmux", "capture-pane", "-p", "-t", self.name]
        shown = subprocess.run(capture, capture_output=True, text=True)
        return shown.stdout

    def type(self, keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, keys, "Enter"], check=True)

    def wait_for(self, text: str, timeout: float = 30) -> None:
        self.tenant.wait(lambda: text in self.screen(), repr(text), timeout=timeout)

    def resize(self, columns: int, rows: int) -> None:
        size = ["-x", str(columns), "-y", str(rows)]
        subprocess.run(["tmux", "resize-window", "-t", self.name, *size], check=True)

    def exit_code(self, timeout: float = 15) -> str:
        self.tenant.wait(self.rc.exists, "kubectl ended", timeout=timeout)
        return self.rc.read_text().strip()

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def test_exec_tty_under_tmux_with_a_resize(tenant, box) -> None:
    terminal = Terminal(tenant, f"exec-{box}", f"exec -it box -n {box} -- sh", "spdy")
    try:
        terminal.wait_for("#")
        terminal.type("stty size")
        terminal.wait_for("30 100", timeout=15)
        terminal.resize(120, 40)
        time.sleep(1)
        terminal.type("stty size")
        terminal.wait_for("40 120", timeout=15)
        terminal.type("exit 5")
        assert terminal.exit_code() == "rc=5"
    finally:
        terminal.close()


def test_debug_it_under_tmux_attaches_to_the_ephemeral_container(tenant, box, image) -> None:
    command = f"debug -it pod/box -n {box} --image={image} --target=main --container=dbg-tty -- sh"
    terminal = Terminal(tenant, f"debug-{box}", command, "websocket")
    try:
        terminal.wait_for("#", timeout=90)
        terminal.type("stty size; echo from-$((40+2))")
        terminal.wait_for("30 100", timeout=15)
        terminal.wait_for("from-42", timeout=15)
        terminal.type("exit")
        assert terminal.exit_code(timeout=30) == "rc=0"
    finally:
        terminal.close()

    def debug_state() -> dict[str, Any]:
        statuses = tenant.pod("box", box)["status"]["ephemeralContainerStatuses"]
        return next(s for s in statuses if s["name"] == "dbg-tty")["state"]

    tenant.wait(lambda: "terminated" in debug_state(), "the debug container terminated")


def test_logs_follow_and_every_flag(tenant, ns, image) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "talker", "labels": {"app": "talk"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "a",
                    "image": image,
                    "command": ["sh", "-c", "for i in 1 2 3 4 5; do echo a$i; sleep 0.4; done"],
                },
                {"name": "b", "image": image, "command": ["sh", "-c", "echo b1; echo b2 >&2"]},
            ],
        },
    }
    tenant.apply(json.dumps(pod), ns)
    tenant.wait(
        lambda: (
            "running" in tenant.pod("talker", ns)["status"]["containerStatuses"][0]["state"]
            or tenant.pod("talker", ns)["status"]["phase"] == "Succeeded"
        ),
        "started",
    )
    followed = _kubectl(tenant, "logs", "-f", "talker", "-c", "a", "-n", ns, timeout=30)
    assert followed.stdout == b"a1\na2\na3\na4\na5\n"  # the follow ended when the container did
    assert _kubectl(tenant, "logs", "talker", "-c", "a", "-n", ns, "--tail=2").stdout == b"a4\na5\n"
    assert _kubectl(tenant, "logs", "talker", "-c", "a", "-n", ns, "--limit-bytes=5").stdout == b"a1\na2"
    stamped = _kubectl(
        tenant, "logs", "talker", "-c", "a", "-n", ns, "--timestamps", "--tail=1"
    ).stdout.decode()
    stamp, text = stamped.strip().split(" ", 1)
    assert text == "a5" and stamp.endswith("Z")
    since = _kubectl(tenant, "logs", "talker", "-c", "a", "-n", ns, f"--since-time={stamp}").stdout
    # sinceTime is a metav1.Time, whole seconds: lines of a5's second are in, a1 (1.6 s before) is not.
    assert since.endswith(b"a5\n") and b"a1" not in since
    assert _kubectl(tenant, "logs", "talker", "-c", "a", "-n", ns, "--since=1h").stdout.count(b"\n") == 5
    both = _kubectl(
        tenant, "logs", "-l", "app=talk", "-n", ns, "--prefix", "--all-containers"
    ).stdout.decode()
    assert "[pod/talker/a] a1" in both and "[pod/talker/b] b1" in both and "[pod/talker/b] b2" in both


def test_logs_previous_after_a_restart(tenant, ns, image) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "again"},
        "spec": {
            "containers": [
                {"name": "main", "image": image, "command": ["sh", "-c", "echo started; sleep 1; exit 1"]}
            ]
        },
    }
    tenant.apply(json.dumps(pod), ns)
    tenant.wait(
        lambda: tenant.pod("again", ns)["status"]["containerStatuses"][0]["restartCount"] >= 1, "a restart"
    )
    previous = _kubectl(tenant, "logs", "again", "-n", ns, "--previous")
    assert previous.returncode == 0 and previous.stdout == b"started\n"


def test_logs_of_a_waiting_container_say_so(tenant, ns, registry) -> None:
    tenant.kubectl("run", "waits", "-n", ns, "--image", f"{registry.host}/test/absent:1", "--restart=Never")
    tenant.wait(lambda: tenant.pod("waits", ns)["status"].get("containerStatuses"), "status")
    done = _kubectl(tenant, "logs", "waits", "-n", ns)
    assert done.returncode == 1
    assert b'container "waits" in pod "waits" is waiting to start: ' in done.stderr


@pytest.mark.parametrize("mode", sorted(MODES))
def test_cp_in_both_directions(tenant, box, mode, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("copied in\n")
    assert _kubectl(tenant, "cp", str(source), f"{box}/box:/tmp/in.txt", mode=mode).returncode == 0
    assert (
        _kubectl(tenant, "exec", "box", "-n", box, "--", "cat", "/tmp/in.txt", mode=mode).stdout
        == b"copied in\n"
    )
    back = tmp_path / "back.txt"
    assert _kubectl(tenant, "cp", f"{box}/box:/tmp/in.txt", str(back), mode=mode).returncode == 0
    assert back.read_text() == "copied in\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("mode", sorted(MODES))
def test_port_forward_to_a_pod_and_a_service(tenant, ns, image, mode) -> None:
    _sleeper(tenant, ns, image, "site", ports=[{"containerPort": 8080}])
    tenant.kubectl(
        "exec",
        "site",
        "-n",
        ns,
        "--",
        "sh",
        "-c",
        "mkdir -p /w; echo hello-forward > /w/index.html; httpd -p 8080 -h /w",
    )
    tenant.kubectl("expose", "pod", "site", "-n", ns, "--port=80", "--target-port=8080")
    for target in ("pod/site", "svc/site"):
        port = _free_port()
        remote = "8080" if target.startswith("pod") else "80"
        env = {**tenant.gateway.tool_env(), **MODES[mode]}
        forward = subprocess.Popen(
            [
                str(server_mod.tool_path("kubectl")),
                f"--kubeconfig={tenant.kubeconfig}",
                "port-forward",
                "-n",
                ns,
                target,
                f"{port}:{remote}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:

            def answer(port: int = port) -> str:
                result = subprocess.run(
                    ["curl", "-fsS", f"http://127.0.0.1:{port}/"], capture_output=True, text=True
                )
                return result.stdout

            assert (
                tenant.wait(answer, f"curl through port-forward of {target}", timeout=30) == "hello-forward\n"
            )
            assert answer() == "hello-forward\n"  # a second connection over the same forward
        finally:
            forward.terminate()
            forward.wait(10)


def test_pod_service_and_node_proxies_and_kubectl_proxy(tenant, ns, image, node) -> None:
    _sleeper(tenant, ns, image, "site", ports=[{"containerPort": 8080, "name": "http"}])
    tenant.kubectl(
        "exec",
        "site",
        "-n",
        ns,
        "--",
        "sh",
        "-c",
        "mkdir -p /w; echo hello-proxy > /w/index.html; httpd -p 8080 -h /w",
    )
    tenant.kubectl("expose", "pod", "site", "-n", ns, "--port=80", "--target-port=8080", "--name=site")
    pod = tenant.wait(
        lambda: (
            tenant.kubectl(
                "get", "--raw", f"/api/v1/namespaces/{ns}/pods/site:8080/proxy/", check=False
            ).stdout
        ),
        "pods/proxy",
    )
    assert pod == "hello-proxy\n"
    named = tenant.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/pods/site:http/proxy/index.html").stdout
    assert named == "hello-proxy\n"
    service = tenant.wait(
        lambda: (
            tenant.kubectl(
                "get", "--raw", f"/api/v1/namespaces/{ns}/services/site:80/proxy/", check=False
            ).stdout
        ),
        "services/proxy",
    )
    assert service == "hello-proxy\n"
    assert tenant.kubectl("get", "--raw", f"/api/v1/nodes/{node.name}/proxy/healthz").stdout == "ok"
    port = _free_port()
    proxy = subprocess.Popen(
        [
            str(server_mod.tool_path("kubectl")),
            f"--kubeconfig={tenant.kubeconfig}",
            "proxy",
            f"--port={port}",
        ],
        env=tenant.gateway.tool_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/v1/namespaces/{ns}/pods/site:8080/proxy/"
        fetched = tenant.wait(
            lambda: subprocess.run(["curl", "-fsS", url], capture_output=True, text=True).stdout,
            "kubectl proxy",
        )
        assert fetched == "hello-proxy\n"
    finally:
        proxy.terminate()
        proxy.wait(10)


def test_debug_starts_an_ephemeral_container_in_the_target_namespace(tenant, box, image) -> None:
    done = _kubectl(
        tenant,
        "debug",
        "-i",
        "pod/box",
        "-n",
        box,
        f"--image={image}",
        "--target=main",
        "--container=dbg",
        "--",
        "sh",
        "-c",
        "sleep 1; ps; echo debug-done",
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    pod = tenant.pod("box", box)
    assert pod["spec"]["ephemeralContainers"][0]["name"] == "dbg"
    tenant.wait(
        lambda: "debug-done" in _kubectl(tenant, "logs", "box", "-n", box, "-c", "dbg").stdout.decode(),
        "the debug container's output",
    )
    processes = _kubectl(tenant, "logs", "box", "-n", box, "-c", "dbg").stdout.decode()
    assert "while true" in processes  # the target's processes are visible: its PID namespace
    status = tenant.pod("box", box)["status"]["ephemeralContainerStatuses"][0]
    assert status["name"] == "dbg"
    changed = tenant.kubectl(
        "patch",
        "pod",
        "box",
        "-n",
        box,
        "--subresource=ephemeralcontainers",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/spec/ephemeralContainers/0/image","value":"other"}]',
        check=False,
    )
    assert changed.returncode != 0
    assert 'existing ephemeral containers "dbg" may not be changed' in changed.stderr


def test_run_rm_interactive(tenant, ns, image) -> None:
    done = _kubectl(
        tenant,
        "run",
        "-i",
        "--rm",
        "once",
        "-n",
        ns,
        f"--image={image}",
        "--restart=Never",
        "--",
        "sh",
        "-c",
        "read l; echo got: $l",
        input="hello\n",
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    assert b"got: hello" in done.stdout
    tenant.wait(
        lambda: tenant.kubectl("get", "pod", "once", "-n", ns, check=False).returncode != 0, "pod deleted"
    )


def test_a_client_that_disconnects_ends_the_exec_process(tenant, box) -> None:
    env = {**tenant.gateway.tool_env(), **MODES["websocket"]}
    session = subprocess.Popen(
        [
            str(server_mod.tool_path("kubectl")),
            f"--kubeconfig={tenant.kubeconfig}",
            "exec",
            "box",
            "-n",
            box,
            "--",
            "sleep",
            "987",
        ],
        env=env,
    )
    try:
        tenant.wait(
            lambda: b"sleep 987" in _kubectl(tenant, "exec", "box", "-n", box, "--", "ps").stdout,
            "the exec'd process",
        )
    finally:
        session.kill()
        session.wait()
    tenant.wait(
        lambda: b"sleep 987" not in _kubectl(tenant, "exec", "box", "-n", box, "--", "ps").stdout,
        "the exec'd process ended",
        timeout=30,
    )


def test_many_concurrent_sessions(tenant, box) -> None:
    env = {**tenant.gateway.tool_env(), **MODES["websocket"]}
    sessions = [
        subprocess.Popen(
            [
                str(server_mod.tool_path("kubectl")),
                f"--kubeconfig={tenant.kubeconfig}",
                "exec",
                "box",
                "-n",
                box,
                "--",
                "sh",
                "-c",
                f"sleep 2; echo {i}; exit {i % 7}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(20)
    ]
    results = [(s.communicate(timeout=120), s.returncode) for s in sessions]
    for i, ((out, _), code) in enumerate(results):
        assert out == f"{i}\n".encode() and code == i % 7


def test_discovery_advertises_the_streaming_subresources(tenant) -> None:
    resources = json.loads(tenant.kubectl("get", "--raw", "/api/v1").stdout)["resources"]
    names = {r["name"] for r in resources}
    assert {
        "pods/log",
        "pods/exec",
        "pods/attach",
        "pods/portforward",
        "pods/proxy",
        "pods/ephemeralcontainers",
        "services/proxy",
        "nodes/proxy",
    } <= names
