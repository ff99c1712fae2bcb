"""The gateway spec's `registries` reach the node: a mirror tried first, credentials by reference.

A sandbox node is started the operator's way, `socialweb-computer node start --spec FILE`, with a
spec whose `registries` name (1) the password-protected registry on loopback with
`credentialsEnv`, so a pod pulls from it with no imagePullSecrets (the node's own credentials,
as a kubelet's node-wide config.json), and (2) a registry host that does not exist, with the
plain registry on loopback as its mirror, so a pod naming that host is pulled from the mirror.
The secret is only in the environment of `node start`; it never appears in the spec or in the
node's node.json. The microVM path applies the same configuration inside the guest
(tests/guest/test_microvm.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from socialweb_computer.bidders import base
from socialweb_computer.testing import images, nodes

from .conftest import Tenant

MISSING_HOST = "registry.example.invalid"
AUTH_ENV = "SOCIALWEB_TEST_REGISTRY_AUTH"


def _node_start(state: Path, spec: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "socialweb_computer", "node", "start", "--state-dir", str(state),
               "--cluster", "ci", "--spec", str(spec), "-o", "json"]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env={**os.environ, **env})


def test_spec_registries_give_a_node_a_mirror_and_credentials_by_reference(
    gateway, tenant: Tenant, registry: images.Registry, private_registry: images.Registry, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "registries": [
            {"host": private_registry.host, "credentialsEnv": AUTH_ENV},
            {"host": MISSING_HOST, "mirrors": [f"http://{registry.host}"]},
        ]
    }))
    state = gateway.state_dir
    before = nodes.HostSnapshot.take(str(state))

    refused = _node_start(state, spec, {})
    assert refused.returncode == 1
    assert f"credentialsEnv names ${AUTH_ENV}, which is unset" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not any(base.nodes_dir(state).glob("sandbox-*")), "nothing starts when the spec does not resolve"

    password = private_registry.password
    started = _node_start(state, spec, {AUTH_ENV: f"{private_registry.username}:{password}"})
    assert started.returncode == 0, started.stderr[-3000:]
    handle = base.NodeHandle.from_json(json.loads(started.stdout))
    try:
        assert password not in spec.read_text()
        assert password not in (handle.directory / "node.json").read_text()
        ready = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
        tenant.wait(lambda: tenant.kubectl("get", "node", handle.name, "-o", ready).stdout == "True",
                    f"node {handle.name} Ready")
        ns = tenant.namespace()
        pin = json.dumps({"spec": {"nodeName": handle.name}})
        for name, image in (("private", f"{private_registry.host}/private/busybox:1"),
                            ("mirrored", f"{MISSING_HOST}/test/busybox-app:1")):
            tenant.kubectl("run", name, "-n", ns, f"--image={image}", "--restart=Never",
                           f"--overrides={pin}", "--", "sh", "-c", f"echo {name} pulled")
        for name in ("private", "mirrored"):
            pod = tenant.wait_phase(name, ns, ("Succeeded", "Failed"), timeout=120)
            assert pod["status"]["phase"] == "Succeeded", pod["status"]
            assert tenant.kubectl("logs", name, "-n", ns).stdout.strip() == f"{name} pulled"
        # An image of its own (not the private one's content under another name): what the
        # status reports is what was pulled through the mirror.
        mirrored = tenant.pod("mirrored", ns)["status"]["containerStatuses"][0]
        assert mirrored["image"] == f"{MISSING_HOST}/test/busybox-app:1"
    finally:
        nodes.stop_node(state, handle.name)
    assert nodes.HostSnapshot.take(str(state)).differences(before) == {}
