"""Streaming with clients other than kubectl: the official Python client (WebSocket v4), and a
GitLab-Runner-shaped attach over SPDY with stdin only (GitLab Runner 18.x's attach strategy:
one command line on the build container's stdin, the exit code on the error channel, and the
job log read back through exec from a byte offset after a dropped connection).

The SPDY client here is the project's own (`node/streaming/spdy.py`, the agent's client to
containerd), used as GitLab Runner uses client-go's SPDY executor: POST .../attach with
`Upgrade: SPDY/3.1` and the five X-Stream-Protocol-Version lines, then the streams error and
stdin, one at a time.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.parse

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.stream import stream

from socialweb_computer import netio
from socialweb_computer.node.streaming import spdy
from socialweb_computer.testing import server as server_mod

PROTOCOLS = (
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
)


def _core(gateway) -> tuple[k8s.ApiClient, k8s.CoreV1Api]:
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(
        config_file=str(gateway.tenant_kubeconfig("ci")), client_configuration=configuration
    )
    api_client = k8s.ApiClient(configuration)
    return api_client, k8s.CoreV1Api(api_client)


def _running(tenant, name: str, ns: str) -> None:
    tenant.wait(
        lambda: (
            "running" in (tenant.pod(name, ns)["status"].get("containerStatuses") or [{}])[0].get("state", {})
        ),
        f"{name} running",
    )


def test_python_client_exec_and_attach(gateway, tenant, ns, image) -> None:
    api_client, core = _core(gateway)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "py-stream"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "stdin": True,
                    "command": ["sh", "-c", 'while read l; do echo "attached: $l"; done'],
                }
            ],
        },
    }
    tenant.apply(json.dumps(pod), ns)
    _running(tenant, "py-stream", ns)
    out = stream(
        core.connect_get_namespaced_pod_exec,
        "py-stream",
        ns,
        command=["sh", "-c", "echo from-exec"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    assert out == "from-exec\n"
    session = stream(
        core.connect_get_namespaced_pod_exec,
        "py-stream",
        ns,
        command=["sh", "-c", "exit 4"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _preload_content=False,
    )
    session.run_forever(timeout=30)
    assert session.returncode == 4
    attach = stream(
        core.connect_get_namespaced_pod_attach,
        "py-stream",
        ns,
        stdin=True,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    attach.write_stdin("hello\n")
    seen = ""
    for _ in range(100):
        attach.update(timeout=0.2)
        seen += attach.read_stdout()
        if "attached: hello" in seen:
            break
    attach.close()
    assert "attached: hello" in seen
    api_client.close()


async def _spdy_attach(gateway, namespace: str, pod: str, container: str, script: str) -> dict:
    credentials = server_mod.read_kubeconfig(gateway.tenant_kubeconfig("ci"))
    url = urllib.parse.urlsplit(credentials.server)
    context = ssl.create_default_context(cadata=credentials.ca_pem.decode())
    context.load_cert_chain(*_key_files(gateway, credentials))
    reader, writer = await asyncio.open_connection(url.hostname, url.port, ssl=context)
    target = f"/api/v1/namespaces/{namespace}/pods/{pod}/attach?container={container}&stdin=true"
    headers = [
        ("Host", url.netloc),
        ("User-Agent", "gitlab-runner-shaped-test"),
        ("Content-Length", "0"),
        ("Connection", "Upgrade"),
        ("Upgrade", "SPDY/3.1"),
    ] + [("X-Stream-Protocol-Version", p) for p in PROTOCOLS]
    writer.write(netio.request_head("POST", target, headers))
    code, head = await netio.read_response_head(reader)
    assert code == 101, head
    assert b"X-Stream-Protocol-Version: v4.channel.k8s.io" in head
    session = spdy.Session(reader, writer)
    session.start()
    error = await session.open({"streamtype": "error"})
    stdin = await session.open({"streamtype": "stdin"})
    await stdin.write(script.encode())
    await stdin.close()
    body = b"".join([chunk async for chunk in error])
    await session.close()
    return json.loads(body) if body else {"status": "Success"}


def _key_files(gateway, credentials) -> tuple[str, str]:
    directory = gateway.state_dir / "runner-shaped"
    directory.mkdir(exist_ok=True, mode=0o700)
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(credentials.cert_pem)
    key.write_bytes(credentials.key_pem)
    key.chmod(0o600)
    return str(cert), str(key)


def test_a_gitlab_runner_shaped_attach_and_log_resume(gateway, tenant, ns, image) -> None:
    # The build container waits for its script on stdin, like GitLab Runner's build container;
    # the script writes the job log into a shared volume and ends with the job's exit status.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "runner-job"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "logs", "emptyDir": {}}],
            "containers": [
                {
                    "name": "build",
                    "image": image,
                    "stdin": True,
                    "stdinOnce": True,
                    "command": ["sh", "-c", 'read line; eval "$line"'],
                    "volumeMounts": [{"name": "logs", "mountPath": "/logs"}],
                },
                {
                    "name": "helper",
                    "image": image,
                    "command": ["sh", "-c", "while true; do sleep 1; done"],
                    "volumeMounts": [{"name": "logs", "mountPath": "/logs"}],
                },
            ],
        },
    }
    tenant.apply(json.dumps(pod), ns)
    _running(tenant, "runner-job", ns)
    script = "for i in 1 2 3 4 5 6; do echo job-line-$i >> /logs/output; sleep 0.3; done; exit 7\n"
    result = asyncio.run(_spdy_attach(gateway, ns, "runner-job", "build", script))
    assert result.get("status") == "Success"  # stdin-only attach: the session ends with stdin
    done = tenant.wait(
        lambda: (
            (s := tenant.pod("runner-job", ns)["status"]["containerStatuses"])
            and [c for c in s if c["name"] == "build" and "terminated" in c["state"]]
        ),
        "build done",
    )
    assert done[0]["state"]["terminated"]["exitCode"] == 7
    # The job log through exec in the helper: a first read drops after some bytes, the second
    # resumes at that byte offset; together they are the log, no line lost or doubled.
    first = tenant.kubectl(
        "exec", "runner-job", "-n", ns, "-c", "helper", "--", "head", "-c", "24", "/logs/output"
    ).stdout
    offset = len(first.encode())
    rest = tenant.kubectl(
        "exec", "runner-job", "-n", ns, "-c", "helper", "--", "tail", "-c", f"+{offset + 1}", "/logs/output"
    ).stdout
    assert first + rest == "".join(f"job-line-{i}\n" for i in range(1, 7))
