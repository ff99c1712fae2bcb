"""GitLab Runner's Kubernetes executor, end to end, holding only the seed's credential and RBAC.

The runner is `testing/gitlab_runner.py`: a test double of GitLab Runner 18.x's executor
(the `gitlab-runner` binary cannot be obtained on these machines) that makes the executor's
sequence of API calls with real clients: kubectl with SPDY forced for exec, the project's
SPDY client for the stdin-only attach, the official Python client for the rest. The
credential is minted by seed step 4's command as the operator page has it, the RBAC is step
5's YAML; the job and helper images are built here.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import gitlab_runner as gr
from socialweb_computer.testing import images, nodes, seed
from socialweb_computer.testing import server as server_mod

from .conftest import Tenant

CLUSTERS = ("ci", "other")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gateway_mod.GatewayProcess]:
    state = tmp_path_factory.mktemp("runner-gateway") / "state"
    with gateway_mod.GatewayProcess.start(
        state, {"clusters": [{"name": c} for c in CLUSTERS]}, timeout=60
    ) as gw:
        for cluster in CLUSTERS:
            gw.wait_phase(cluster, "Ready", timeout=60)
        yield gw


@pytest.fixture(scope="module")
def helper_image(registry: images.Registry) -> str:
    return registry.push(gr.helper_image(), "test/gitlab-runner-helper:1")


def _mint(gateway: gateway_mod.GatewayProcess, cluster: str, out_dir: Path) -> None:
    script = seed.mint_script(str(gateway.state_dir), str(gateway.kubeconfig), str(out_dir), cluster)
    env = gateway.tool_env({"PATH": f"{server_mod.TOOLS_BIN}:{Path(sys.executable).parent}:/usr/bin:/bin"})
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    tenant_admin = gateway.tenant_kubeconfig(cluster)
    gateway.kubectl_with(tenant_admin, "apply", "-f", "-", input=seed.runner_rbac_yaml())


def _runner(gateway, cluster: str, image: str, helper_image: str, tmp: Path, **overrides: Any) -> gr.Runner:
    """A runner configured by 02's config.toml section, as the page has it, for this cluster."""
    out_dir = tmp / f"etc-{cluster}"
    _mint(gateway, cluster, out_dir)
    toml = seed.runner_config_toml(gateway.cluster_url(cluster), str(out_dir), image, helper_image)
    credential, config = gr.from_config_toml(toml)
    config = dataclasses.replace(config, **overrides)
    return gr.Runner(credential, config, tmp / f"runner-{cluster}")


@pytest.fixture(scope="module")
def runner(gateway, node, image, helper_image, tmp_path_factory) -> Iterator[gr.Runner]:
    made = _runner(gateway, "ci", image, helper_image, tmp_path_factory.mktemp("runner"))
    yield made
    made.close()


def _left_behind(tenant: Tenant) -> dict[str, list[str]]:
    """What of any job is still in the runner's namespace (pods, secrets, services, PDBs)."""
    kinds = ("pods", "secrets", "services", "poddisruptionbudgets")
    listed = json.loads(tenant.kubectl("get", ",".join(kinds), "-n", "gitlab-runner", "-o", "json").stdout)[
        "items"
    ]
    return {
        kind: names
        for kind in ("Pod", "Secret", "Service", "PodDisruptionBudget")
        if (
            names := [
                i["metadata"]["name"]
                for i in listed
                if i["kind"] == kind and "runner-" in i["metadata"]["name"]
            ]
        )
    }


def _clean(tenant: Tenant) -> None:
    tenant.wait(lambda: not _left_behind(tenant), "nothing of the job left", timeout=60)


def test_a_passing_job(runner: gr.Runner, tenant: Tenant, image: str) -> None:
    result = runner.run(gr.Job(image=image, script="echo hello from the job\nid -u", job_id=1))
    assert result.status == "success", (result.message, result.log)
    assert result.exit_code == 0
    assert "hello from the job" in result.log and "0" in result.log
    assert "after_script done" in result.log
    _clean(tenant)


def test_a_failing_job_reports_its_exit_code(runner: gr.Runner, tenant: Tenant, image: str) -> None:
    result = runner.run(gr.Job(image=image, script="echo about to fail\nexit 3", job_id=2))
    assert result.status == "failed"
    assert result.exit_code == 3
    assert result.message == "ERROR: Job failed: exit code 3"
    assert "about to fail" in result.log
    assert "after_script done" in result.log  # after_script runs after a failed script
    _clean(tenant)


def test_a_service_container_on_localhost_and_by_alias(
    runner: gr.Runner, tenant: Tenant, image: str, registry: images.Registry
) -> None:
    service = gr.CiService(
        image=image,
        alias="db.internal",
        command=(
            "sh",
            "-c",
            "mkdir -p /www && echo service-answer > /www/index.html && httpd -f -p 8080 -h /www",
        ),
        port=8080,
    )
    script = (
        "for i in $(seq 30); do wget -qO- http://localhost:8080/ && break; sleep 1; done\n"
        "wget -qO- http://db.internal:8080/"
    )
    result = runner.run(gr.Job(image=image, script=script, services=(service,), job_id=3))
    assert result.status == "success", (result.message, result.log)
    assert result.log.count("service-answer") == 2
    _clean(tenant)


def test_a_cancelled_job(runner: gr.Runner, tenant: Tenant, image: str) -> None:
    script = "echo started\nsleep 600\necho never printed"
    result = runner.run(gr.Job(image=image, script=script, cancel_after=5, job_id=4))
    assert result.status == "canceled", (result.message, result.log)
    assert "started" in result.log and "never printed" not in result.log
    _clean(tenant)


def test_a_job_whose_pod_cannot_start(
    gateway, node, image, helper_image, tenant: Tenant, registry: images.Registry, tmp_path: Path
) -> None:
    # poll_timeout is the runner's 180 s by default; a short one keeps the suite short.
    quick = _runner(gateway, "ci", image, helper_image, tmp_path, poll_timeout=20)
    try:
        result = quick.run(gr.Job(image=f"{registry.host}/test/does-not-exist:1", script="true", job_id=5))
    finally:
        quick.close()
    assert result.status == "system failure"
    assert (
        result.message == "prepare environment: waiting for pod running: timed out waiting for pod to start"
    )
    events = "\n".join(result.log)
    assert "Failed to pull image" in events or "ErrImagePull" in events or "BackOff" in events, events
    _clean(tenant)


def test_a_dropped_log_connection_resumes_at_its_offset(
    runner: gr.Runner, tenant: Tenant, image: str
) -> None:
    script = "for i in $(seq 1 12); do echo line-$i; sleep 0.3; done"
    result = runner.run(gr.Job(image=image, script=script, drop_log_after_lines=4, job_id=6))
    assert result.status == "success", (result.message, result.log)
    assert result.log_reconnects >= 1
    lines = [line for line in result.log if line.startswith("line-")]
    assert lines == [f"line-{i}" for i in range(1, 13)]  # none lost, none doubled
    _clean(tenant)


def test_two_jobs_at_once_on_one_tenant(runner: gr.Runner, tenant: Tenant, image: str) -> None:
    results: dict[int, gr.JobResult] = {}

    def run(index: int) -> None:
        results[index] = runner.run(
            gr.Job(image=image, script=f"sleep 2\necho job-{index}", job_id=10 + index)
        )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(results) == [0, 1]
    for index, result in results.items():
        assert result.status == "success", (result.message, result.log)
        assert f"job-{index}" in result.log and f"job-{1 - index}" not in result.log
    assert results[0].pod != results[1].pod
    _clean(tenant)


def test_jobs_on_two_tenants_whose_credentials_do_not_cross(
    gateway, runner: gr.Runner, helper_image, tenant: Tenant, image: str, registry, tmp_path: Path
) -> None:
    other_tenant = Tenant(gateway, "other")
    with nodes.sandbox_node(gateway.state_dir, "other", host_ports=[registry.port]) as handle:
        other_tenant.wait(
            lambda: (
                "True"
                in other_tenant.kubectl(
                    "get",
                    "node",
                    handle.name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                ).stdout
            ),
            "the other tenant's node Ready",
        )
        other = _runner(gateway, "other", image, helper_image, tmp_path)
        try:
            results: dict[str, gr.JobResult] = {}
            threads = [
                threading.Thread(
                    target=lambda: results.update(ci=runner.run(gr.Job(image=image, script="echo on-ci")))
                ),
                threading.Thread(
                    target=lambda: results.update(
                        other=other.run(gr.Job(image=image, script="echo on-other"))
                    )
                ),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)
            assert results["ci"].status == "success" and "on-ci" in results["ci"].log
            assert results["other"].status == "success" and "on-other" in results["other"].log
            # ci's client certificate means nothing to the other tenant's apiserver (its own
            # ClientCA did not sign it), even with the other tenant's serving CA trusted.
            crossed_dir = tmp_path / "crossed"
            crossed_dir.mkdir()
            (crossed_dir / "ca.crt").write_bytes((other.credential.directory / "ca.crt").read_bytes())
            for name in ("tls.crt", "tls.key"):
                (crossed_dir / name).write_bytes((runner.credential.directory / name).read_bytes())
            crossed = gr.Credential(server=other.credential.server, directory=crossed_dir)
            kubeconfig = crossed.kubeconfig(tmp_path / "crossed.kubeconfig")
            denied = gateway.kubectl_with(kubeconfig, "get", "pods", "-n", "gitlab-runner", check=False)
            assert denied.returncode != 0 and "Unauthorized" in denied.stderr, denied.stderr
        finally:
            other.close()
        _clean(other_tenant)
    _clean(tenant)

