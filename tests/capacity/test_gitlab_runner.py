"""GitLab Runner's Kubernetes executor, end to end from zero nodes, holding only the seed's
credential and RBAC.

The runner is `testing/gitlab_runner.py`: a test double of GitLab Runner 18.x's executor
(the `gitlab-runner` binary cannot be obtained on these machines) that makes the executor's
sequence of API calls with real clients: kubectl with SPDY forced for exec, the project's
SPDY client for the stdin-only attach, the official Python client for the rest. The
credential is minted by seed step 4's command as the operator page has it, the RBAC is step
5's YAML, the runner's settings are 02's config.toml section; the job and helper images are
built here.

The clusters have no node between jobs: the gateway's capacity controller rents a sandbox
node when a job's pod is pending and releases it after a short hold, and every test checks
that after its job no node remains. The same path on the QEMU bidder is in tests/guest (slow).
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from socialweb_computer import testing
from socialweb_computer.testing import gateway as gateway_mod
from socialweb_computer.testing import gitlab_runner as gr
from socialweb_computer.testing import images, nodes, seed

from .conftest import SMALL_NODE, Capacity, _node_names, leaks, stop_every_node, wait

CLUSTERS = ("ci", "other")
HOLD_SECONDS = 3  # the hold before an idle cluster's node goes (120 s by default)


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, registry: images.Registry
) -> Iterator[gateway_mod.GatewayProcess]:
    """One gateway for the module, both clusters at zero nodes; the host is checked after."""
    state = tmp_path_factory.mktemp("runner-gateway") / "state"
    before = nodes.HostSnapshot.take(str(state))
    spec = {
        "capacity": {"bidder": "sandbox", "hostBudget": {"vcpu": 4, "memMiB": 4096, "diskMiB": 8192}},
        "nodeDefaults": {**SMALL_NODE, "releaseAfterSeconds": HOLD_SECONDS},
        "registries": [{"host": registry.host}],  # on loopback: its port is forwarded into nodes
        "clusters": [{"name": c} for c in CLUSTERS],
    }
    gw = gateway_mod.GatewayProcess.start(
        state, spec, timeout=60, env={"SOCIALWEB_CAPACITY_DRAIN_TIMEOUT": "15"}
    )
    try:
        for cluster in CLUSTERS:
            gw.wait_phase(cluster, "Ready", timeout=60)
        yield gw
    finally:
        gw.stop()
        stop_every_node(state)
    assert leaks(before, nodes.HostSnapshot.take(str(state)), _node_names(state)) == {}
    tracebacks = testing.logged_tracebacks(gw)
    assert not tracebacks, f"the gateway logged {len(tracebacks)} traceback(s); the first:\n{tracebacks[0]}"


@pytest.fixture(scope="module")
def cap(gateway: gateway_mod.GatewayProcess) -> Capacity:
    return Capacity(gateway)


@pytest.fixture(scope="module")
def helper_image(registry: images.Registry) -> str:
    return registry.push(gr.helper_image(), "test/gitlab-runner-helper:1")


@pytest.fixture(scope="module")
def credentials(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runner")


@pytest.fixture(scope="module")
def runner(gateway, image, helper_image, credentials: Path) -> Iterator[gr.Runner]:
    made = gr.for_cluster(gateway, "ci", image, helper_image, credentials)
    yield made
    made.close()


def _left_behind(cap: Capacity, cluster: str) -> dict[str, list[str]]:
    """What of any job is still in the runner's namespace (pods, secrets, services, PDBs)."""
    kinds = ("pods", "secrets", "services", "poddisruptionbudgets")
    listed = cap.json(cluster, "get", ",".join(kinds), "-n", "gitlab-runner")["items"]
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


def _clean(cap: Capacity, cluster: str = "ci") -> None:
    """Nothing of the job remains, and after the hold no node does either."""
    wait(lambda: not _left_behind(cap, cluster), "nothing of the job left", timeout=60)
    wait(lambda: cap.node_names(cluster) == [], f"{cluster}'s node released after the hold", timeout=120)
    assert cap.cluster(cluster)["status"]["nodes"] == 0


def test_a_passing_job(runner: gr.Runner, cap: Capacity, image: str) -> None:
    result = runner.run(gr.Job(image=image, script="echo hello from the job\nid -u", job_id=1))
    assert result.status == "success", (result.message, result.log)
    assert result.exit_code == 0
    assert "hello from the job" in result.log and "0" in result.log
    assert "after_script done" in result.log
    # The cluster had no node: the job's pod rented one, then was scheduled on it.
    said = [r for r, _ in cap.reasons("ci", result.pod, "gitlab-runner")]
    assert "TriggeredScaleUp" in said and said.index("TriggeredScaleUp") < said.index("Scheduled"), said
    _clean(cap)


def test_a_failing_job_reports_its_exit_code(runner: gr.Runner, cap: Capacity, image: str) -> None:
    result = runner.run(gr.Job(image=image, script="echo about to fail\nexit 3", job_id=2))
    assert result.status == "failed"
    assert result.exit_code == 3
    assert result.message == "ERROR: Job failed: exit code 3"
    assert "about to fail" in result.log
    assert "after_script done" in result.log  # after_script runs after a failed script
    _clean(cap)


def test_a_service_container_on_localhost_and_by_alias(
    runner: gr.Runner, cap: Capacity, image: str, registry: images.Registry
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
    _clean(cap)


def test_a_cancelled_job(runner: gr.Runner, cap: Capacity, image: str) -> None:
    script = "echo started\nsleep 600\necho never printed"
    result = runner.run(gr.Job(image=image, script=script, cancel_after=5, job_id=4))
    assert result.status == "canceled", (result.message, result.log)
    assert "started" in result.log and "never printed" not in result.log
    _clean(cap)


def test_a_job_whose_pod_cannot_start(
    gateway, image, helper_image, cap: Capacity, registry: images.Registry, credentials: Path
) -> None:
    # poll_timeout is the runner's 180 s by default; a short one keeps the suite short (the node
    # is rented within it, then the image cannot be pulled).
    quick = gr.for_cluster(gateway, "ci", image, helper_image, credentials, poll_timeout=40)
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
    _clean(cap)


def test_a_dropped_log_connection_resumes_at_its_offset(runner: gr.Runner, cap: Capacity, image: str) -> None:
    script = "for i in $(seq 1 12); do echo line-$i; sleep 0.3; done"
    result = runner.run(gr.Job(image=image, script=script, drop_log_after_lines=4, job_id=6))
    assert result.status == "success", (result.message, result.log)
    assert result.log_reconnects >= 1
    lines = [line for line in result.log if line.startswith("line-")]
    assert lines == [f"line-{i}" for i in range(1, 13)]  # none lost, none doubled
    _clean(cap)


def test_two_jobs_at_once_on_one_tenant(runner: gr.Runner, cap: Capacity, image: str) -> None:
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
    _clean(cap)


def test_jobs_on_two_tenants_whose_credentials_do_not_cross(
    gateway, runner: gr.Runner, helper_image, cap: Capacity, image: str, credentials: Path, tmp_path: Path
) -> None:
    other = gr.for_cluster(gateway, "other", image, helper_image, credentials)
    try:
        results: dict[str, gr.JobResult] = {}
        threads = [
            threading.Thread(
                target=lambda: results.update(ci=runner.run(gr.Job(image=image, script="echo on-ci")))
            ),
            threading.Thread(
                target=lambda: results.update(other=other.run(gr.Job(image=image, script="echo on-other")))
            ),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert results["ci"].status == "success" and "on-ci" in results["ci"].log
        assert results["other"].status == "success" and "on-other" in results["other"].log
        # Each tenant rented its own node from zero.
        for cluster in CLUSTERS:
            said = [r for r, _ in cap.reasons(cluster, results[cluster].pod, "gitlab-runner")]
            assert "TriggeredScaleUp" in said, (cluster, said)
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
    _clean(cap, "other")
    _clean(cap)


def _shown_in(expected: str, output: str) -> bool:
    """Whether a `# ...` line of a page matches what the command printed (placeholders and
    `...` stand for what differs per run)."""
    pieces = [p for p in re.split(r"<[^>]+>|\.\.\.", expected) if p.strip()]
    return all(" ".join(p.split()) in " ".join(output.split()) for p in pieces)


def _run_page_block(gateway, commands: str, shown: list[str], filled: dict[str, str]) -> None:
    for placeholder, value in filled.items():
        commands = commands.replace(placeholder, value)
    assert "<" not in commands, f"an unfilled placeholder in: {commands}"
    output = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands],
        capture_output=True,
        text=True,
        env=gateway.tool_env(),
        timeout=60,
    )
    assert output.returncode == 0, (commands, output.stderr)
    printed = output.stdout + output.stderr
    for line in shown:
        if not _shown_in(line, printed):
            raise AssertionError(f"{commands!r} did not show {line!r}:\n{printed}")


def test_every_command_of_02_and_03_as_written(gateway, runner: gr.Runner, cap: Capacity, image: str) -> None:
    """The pages' bash blocks with their placeholders filled in: 02's before any job (the
    cluster has no node), 03's during a job (its pod exists and rented the node).

    `gitlab-runner register` is the one command not run: it needs the gitlab-runner binary and a
    GitLab; the config.toml section it leads to is what every runner in this module is built from.
    """
    filled = {
        "<tenant admin kubeconfig>": str(gateway.tenant_kubeconfig("ci")),
        "<admin kubeconfig>": str(gateway.kubeconfig),
    }
    wait(lambda: cap.node_names("ci") == [], "ci at zero nodes")
    before_job = [b for b in seed.bash_blocks("02-gitlab-runner.md") if not b[0].startswith("gitlab-runner ")]
    for commands, shown in before_job:
        _run_page_block(gateway, commands, shown, filled)

    done: dict[str, gr.JobResult] = {}
    job = threading.Thread(
        target=lambda: done.update(
            job=runner.run(gr.Job(image=image, script="echo docs\nsleep 20", job_id=99))
        )
    )
    job.start()
    try:
        pod = wait(
            lambda: (
                cap.kubectl("ci", "get", "pods", "-n", "gitlab-runner", "-o", "name").stdout.strip()
                if cap.node_names("ci")
                else ""
            ),
            "the job's pod on a rented node",
        ).removeprefix("pod/")
        during_job = seed.bash_blocks("03-jobs.md")
        assert len(before_job) + len(during_job) >= 3
        for commands, shown in during_job:
            _run_page_block(gateway, commands, shown, {**filled, "<pod>": pod})
    finally:
        job.join(timeout=300)
    assert done["job"].status == "success", done["job"].message
    _clean(cap)
