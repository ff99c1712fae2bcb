"""A stand-in for GitLab Runner's Kubernetes executor, for the end-to-end tests and the soak.

This is a test double, and says so: the `gitlab-runner` binary cannot be obtained on these
machines. What it does is the executor's own sequence of API calls, as GitLab Runner 18.x's
`executors/kubernetes` makes them with the attach strategy (the only one left), made with
real clients and holding only the runner's credential (seed step 4) and RBAC (seed step 5):

1. two SelfSubjectAccessReviews, `list` and `watch` on pods, to choose watching over polling;
2. the job's image-pull Secret, then the job Pod: an `init-permissions` init container, the
   `build` and `helper` containers waiting on stdin, one container per CI service (reached on
   localhost and by alias through `hostAliases`), emptyDir volumes for the build directory,
   the scripts and the logs; then ownerReferences from the Secret to the Pod, and a Service per
   CI service port and a PodDisruptionBudget (`minAvailable: 1`) owned by the Pod;
3. a watch on the Pod (field selector `metadata.name`) until it is Running with `build` and
   `helper` ready, for at most `poll_timeout`, else the job fails with GitLab's "timed out
   waiting for pod to start" and the Pod's events printed into the job log;
4. per stage, an exec that writes the stage's script into the scripts volume, and an attach
   over SPDY with stdin only that sends one command line to the build container's shell; the
   script's trap writes `{"command_exit_code": N, "script": ...}` into the log;
5. a long-lived exec of `gitlab-runner-helper read-logs --path <log> --offset <n>` in the
   helper container streams the job log back (each line prefixed with the byte offset after
   it), and is reopened from the last offset when its connection drops;
6. on cancel, an exec runs the cancellation in the build container;
7. at the end the Pod is deleted with `propagationPolicy=Background`; the garbage collector
   removes what the Pod owns.

kubectl (SPDY forced: client-go's SPDY executor is what GitLab Runner uses) does the execs;
the stdin-only attach is made with the project's SPDY client, frame for frame what client-go
sends (kubectl cannot attach with stdin alone); the official Python client does the rest.
Exec and attach are retried on `error dialing backend`, `connection refused` and unexpected
EOF, as the runner retries them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import queue
import secrets
import shlex
import ssl
import subprocess
import sys
import threading
import time
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from socialweb_computer import netio
from socialweb_computer.node.streaming import spdy
from socialweb_computer.testing import images, seed
from socialweb_computer.testing import server as server_mod

GITLAB_RUNNER_VERSION = "18.5"  # the executor whose behaviour this follows
HELPER_PATH = "usr/bin/gitlab-runner-helper"
RETRIED = ("error dialing backend", "connection refused", "unexpected EOF")
STAGES = ("prepare_script", "get_sources", "step_script", "after_script")

# The helper's `read-logs` subcommand with the real one's flags and output: it waits for the log
# file, then follows it from byte --offset, each line prefixed with the byte offset after it.
READ_LOGS = r"""#!/bin/sh
set -eu
[ "${1:-}" = read-logs ] || { echo "gitlab-runner-helper: unknown command ${1:-}" >&2; exit 2; }
shift
path="" offset=0 wait=60
while [ $# -gt 0 ]; do
    case "$1" in
        --path) path=$2; shift 2 ;;
        --offset) offset=$2; shift 2 ;;
        --wait-file-timeout) wait=${2%s}; wait=${wait%m0}; shift 2 ;;
        *) echo "gitlab-runner-helper: unknown flag $1" >&2; exit 2 ;;
    esac
done
tries=0
while [ ! -e "$path" ]; do
    tries=$((tries + 1))
    [ "$tries" -le $((wait * 10)) ] || { echo "timed out waiting for $path" >&2; exit 1; }
    sleep 0.1
done
tail -c +$((offset + 1)) -f "$path" | awk -v o="$offset" '{ o += length($0) + 1; print o " " $0; fflush() }'
"""

# The build container's shell detection, as the runner's (bash if present, else sh), reading
# the command lines the attaches send.
SHELL_DETECTION = (
    "if [ -x /usr/local/bin/bash ]; then exec /usr/local/bin/bash; "
    "elif [ -x /usr/bin/bash ]; then exec /usr/bin/bash; "
    "elif [ -x /bin/bash ]; then exec /bin/bash; "
    "else exec sh; fi"
)


def helper_image() -> Any:
    """The helper image the tests build: busybox with `gitlab-runner-helper read-logs`."""
    return images.busybox_image(extra_files={HELPER_PATH: READ_LOGS.encode()})


@dataclasses.dataclass(frozen=True)
class Credential:
    """The seed's hand-back: the URL and the three files of step 4."""

    server: str
    directory: Path  # ca.crt, tls.crt, tls.key

    def kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tenant",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.directory / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": "gitlab-runner",
                    "user": {
                        "client-certificate": str(self.directory / "tls.crt"),
                        "client-key": str(self.directory / "tls.key"),
                    },
                }
            ],
            "contexts": [{"name": "tenant", "context": {"cluster": "tenant", "user": "gitlab-runner"}}],
            "current-context": "tenant",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.directory / "ca.crt"))
        context.load_cert_chain(str(self.directory / "tls.crt"), str(self.directory / "tls.key"))
        return context


@dataclasses.dataclass(frozen=True)
class CiService:
    """A CI `services:` entry: an image, an alias, and the port it listens on."""

    image: str
    alias: str
    command: tuple[str, ...] = ()
    port: int = 0


@dataclasses.dataclass
class Job:
    image: str
    script: str  # the step_script's lines
    after_script: str = "echo after_script done"
    services: tuple[CiService, ...] = ()
    cancel_after: float = 0.0  # seconds into step_script; 0: never
    drop_log_after_lines: int = 0  # the log connection drops once after this many lines; 0: never
    job_id: int = 0


@dataclasses.dataclass
class JobResult:
    status: str  # "success", "failed", "canceled", "system failure"
    exit_code: int | None
    log: list[str]
    message: str = ""
    pod: str = ""
    pod_created: float = 0.0
    first_line: float = 0.0  # when the first line of the job's own script reached the runner
    log_reconnects: int = 0

    @property
    def start_latency(self) -> float:
        return self.first_line - self.pod_created if self.first_line else 0.0


class JobFailed(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class RunnerConfig:
    """The `[runners.kubernetes]` settings this stand-in honours (names as in config.toml)."""

    namespace: str = "gitlab-runner"
    helper_image: str = ""
    poll_timeout: float = 180.0
    poll_interval: float = 3.0
    pod_disruption_budget: bool = False
    pod_termination_grace_period_seconds: int = 1
    image_pull_secret: str = ""  # a dockerconfigjson for the job's registry ("" for none needed)


def from_config_toml(text: str) -> tuple[Credential, RunnerConfig]:
    """The credential and settings of the first `[runners.kubernetes]` section of a config.toml."""
    kubernetes = tomllib.loads(text)["runners"][0]["kubernetes"]
    files = {Path(kubernetes[key]).parent for key in ("cert_file", "key_file", "ca_file")}
    if len(files) != 1:
        raise ValueError("cert_file, key_file and ca_file are expected side by side, as step 4 writes them")
    names = {Path(kubernetes[k]).name for k in ("cert_file", "key_file", "ca_file")}
    if names != {"tls.crt", "tls.key", "ca.crt"}:
        raise ValueError(f"unexpected credential file names {sorted(names)}")
    settings = {
        field.name: kubernetes[field.name]
        for field in dataclasses.fields(RunnerConfig)
        if field.name in kubernetes
    }
    return Credential(server=kubernetes["host"], directory=files.pop()), RunnerConfig(**settings)


def for_cluster(
    gateway: Any, cluster: str, image: str, helper: str, work_dir: Path, **overrides: Any
) -> Runner:
    """A runner for one of `gateway`'s clusters, set up as the operator pages say: the credential
    minted by 01 step 4's command into `work_dir/etc-<cluster>` (once), step 5's RBAC applied
    with the tenant's admin credential, the settings from 02's config.toml section (`overrides`
    replace some of them). `gateway` is a `testing.gateway.GatewayProcess`."""
    out_dir = work_dir / f"etc-{cluster}"
    if not out_dir.exists():
        script = seed.mint_script(str(gateway.state_dir), str(gateway.kubeconfig), str(out_dir), cluster)
        path = f"{server_mod.TOOLS_BIN}:{Path(sys.executable).parent}:/usr/bin:/bin"
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True,
            env=gateway.tool_env({"PATH": path}),
        )
        if done.returncode != 0:
            raise RuntimeError(f"seed step 4 failed for cluster {cluster}: {done.stderr}")
        gateway.kubectl_with(
            gateway.tenant_kubeconfig(cluster), "apply", "-f", "-", input=seed.runner_rbac_yaml()
        )
    toml = seed.runner_config_toml(gateway.cluster_url(cluster), str(out_dir), image, helper)
    credential, config = from_config_toml(toml)
    config = dataclasses.replace(config, **overrides)
    suffix = "-".join(f"{k}-{v}" for k, v in sorted(overrides.items()))
    return Runner(credential, config, work_dir / f"runner-{cluster}{'-' + suffix if suffix else ''}")


class Runner:
    """One runner holding one tenant's credential; `run(job)` is one CI job from start to cleanup."""

    def __init__(self, credential: Credential, config: RunnerConfig, work_dir: Path) -> None:
        self.credential = credential
        self.config = config
        self.work_dir = work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = credential.kubeconfig(work_dir / "runner.kubeconfig")
        configuration = k8s.Configuration()
        configuration.host = credential.server
        configuration.ssl_ca_cert = str(credential.directory / "ca.crt")
        configuration.cert_file = str(credential.directory / "tls.crt")
        configuration.key_file = str(credential.directory / "tls.key")
        self.api_client = k8s.ApiClient(configuration)
        self.core = k8s.CoreV1Api(self.api_client)
        self.policy = k8s.PolicyV1Api(self.api_client)
        self.authz = k8s.AuthorizationV1Api(self.api_client)
        self.token = secrets.token_hex(4)
        self._concurrent = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        self.api_client.close()

    # ------------------------------------------------------------ the job

    def run(self, job: Job) -> JobResult:
        with self._lock:
            slot, self._concurrent = self._concurrent, self._concurrent + 1
        name = f"runner-{self.token}-project-1-concurrent-{slot}-{secrets.token_hex(4)}"
        result = JobResult(status="running", exit_code=None, log=[], pod=name)
        log_reader: LogReader | None = None
        try:
            use_watch = self._may_watch_pods()
            self._create_pod_and_dependents(name, job)
            result.pod_created = time.monotonic()
            self._wait_until_running(name, use_watch, result)
            log_reader = LogReader(self, name, job.drop_log_after_lines)
            self._run_stages(name, job, log_reader, result)
        except JobFailed as failure:
            result.status, result.message = failure.status, str(failure)
        finally:
            if log_reader is not None:
                log_reader.stop()
                result.log_reconnects = log_reader.reconnects
            self.core.delete_namespaced_pod(
                name, self.config.namespace, propagation_policy="Background", _request_timeout=30
            )
            with self._lock:
                self._concurrent -= 1
        return result

    def _may_watch_pods(self) -> bool:
        allowed = []
        for verb in ("list", "watch"):
            review = k8s.V1SelfSubjectAccessReview(
                spec=k8s.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=k8s.V1ResourceAttributes(
                        namespace=self.config.namespace, verb=verb, resource="pods"
                    )
                )
            )
            answer = self.authz.create_self_subject_access_review(review, _request_timeout=30)
            allowed.append(bool(answer.status.allowed))
        return all(allowed)

    def _create_pod_and_dependents(self, name: str, job: Job) -> k8s.V1Pod:
        ns = self.config.namespace
        labels = {"pod": name, "job.runner.gitlab.com/id": str(job.job_id), "manager": "gitlab-runner"}
        secret = None
        if self.config.image_pull_secret:
            secret = self.core.create_namespaced_secret(
                ns,
                k8s.V1Secret(
                    metadata=k8s.V1ObjectMeta(generate_name=f"{name}-"),
                    type="kubernetes.io/dockerconfigjson",
                    string_data={".dockerconfigjson": self.config.image_pull_secret},
                ),
                _request_timeout=30,
            )
        pod = self.core.create_namespaced_pod(ns, self._pod(name, job, labels, secret), _request_timeout=30)
        owner = [k8s.V1OwnerReference(api_version="v1", kind="Pod", name=name, uid=pod.metadata.uid)]
        if secret is not None:
            secret.metadata.owner_references = owner
            self.core.replace_namespaced_secret(secret.metadata.name, ns, secret, _request_timeout=30)
        for index, service in enumerate(s for s in job.services if s.port):
            self.core.create_namespaced_service(
                ns,
                k8s.V1Service(
                    metadata=k8s.V1ObjectMeta(name=f"{name}-svc-{index}", owner_references=owner),
                    spec=k8s.V1ServiceSpec(
                        selector={"pod": name},
                        ports=[k8s.V1ServicePort(port=service.port, target_port=service.port)],
                    ),
                ),
                _request_timeout=30,
            )
        if self.config.pod_disruption_budget:
            self.policy.create_namespaced_pod_disruption_budget(
                ns,
                k8s.V1PodDisruptionBudget(
                    metadata=k8s.V1ObjectMeta(name=name, owner_references=owner),
                    spec=k8s.V1PodDisruptionBudgetSpec(
                        min_available=1, selector=k8s.V1LabelSelector(match_labels={"pod": name})
                    ),
                ),
                _request_timeout=30,
            )
        return pod

    def _pod(self, name: str, job: Job, labels: dict[str, str], secret: k8s.V1Secret | None) -> k8s.V1Pod:
        mounts = [
            k8s.V1VolumeMount(name="repo", mount_path="/builds"),
            k8s.V1VolumeMount(name="scripts", mount_path=self.scripts_dir),
            k8s.V1VolumeMount(name="logs", mount_path=self.logs_dir),
        ]
        permissions = (
            f"touch {self.log_path} && (chmod 777 {self.logs_dir} {self.scripts_dir} /builds) "
            f"&& chmod 666 {self.log_path}"
        )
        containers = [
            k8s.V1Container(
                name="build",
                image=job.image,
                command=["sh", "-c", SHELL_DETECTION],
                stdin=True,
                volume_mounts=mounts,
            ),
            k8s.V1Container(
                name="helper",
                image=self.config.helper_image,
                command=["sh", "-c", SHELL_DETECTION],
                stdin=True,
                volume_mounts=mounts,
            ),
        ]
        for index, service in enumerate(job.services):
            containers.append(
                k8s.V1Container(
                    name=f"svc-{index}", image=service.image, command=list(service.command) or None
                )
            )
        aliases = [s.alias for s in job.services if s.alias]
        return k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(name=name, labels=labels),
            spec=k8s.V1PodSpec(
                restart_policy="Never",
                termination_grace_period_seconds=self.config.pod_termination_grace_period_seconds,
                image_pull_secrets=[k8s.V1LocalObjectReference(name=secret.metadata.name)]
                if secret
                else None,
                host_aliases=[k8s.V1HostAlias(ip="127.0.0.1", hostnames=aliases)] if aliases else None,
                init_containers=[
                    k8s.V1Container(
                        name="init-permissions",
                        image=self.config.helper_image,
                        command=["sh", "-c", permissions],
                        volume_mounts=mounts,
                    )
                ],
                containers=containers,
                volumes=[
                    k8s.V1Volume(name=v, empty_dir=k8s.V1EmptyDirVolumeSource())
                    for v in ("repo", "scripts", "logs")
                ],
            ),
        )

    scripts_dir = "/scripts-1-0"
    logs_dir = "/logs-1-0"
    log_path = "/logs-1-0/output.log"

    def _wait_until_running(self, name: str, use_watch: bool, result: JobResult) -> None:
        deadline = time.monotonic() + self.config.poll_timeout
        while time.monotonic() < deadline:
            if use_watch:
                remaining = max(1, int(min(self.config.poll_interval * 10, deadline - time.monotonic())))
                watcher = k8s_watch.Watch()
                for event in watcher.stream(
                    self.core.list_namespaced_pod,
                    self.config.namespace,
                    field_selector=f"metadata.name={name}",
                    timeout_seconds=remaining,
                ):
                    if self._started(event["object"]):
                        watcher.stop()
                        return
            else:
                pod = self.core.read_namespaced_pod(name, self.config.namespace, _request_timeout=30)
                if self._started(pod):
                    return
                time.sleep(self.config.poll_interval)
        result.log.extend(self._events_of(name))
        raise JobFailed(
            "system failure",
            "prepare environment: waiting for pod running: timed out waiting for pod to start",
        )

    def _started(self, pod: k8s.V1Pod) -> bool:
        status = pod.status
        if status is None:
            return False
        if status.phase in ("Succeeded", "Failed"):
            raise JobFailed("system failure", f"pod {pod.metadata.name} ended before the job: {status.phase}")
        ready = {c.name for c in status.container_statuses or [] if c.ready}
        return status.phase == "Running" and {"build", "helper"} <= ready

    def _events_of(self, name: str) -> list[str]:
        events = self.core.list_namespaced_event(
            self.config.namespace, field_selector=f"involvedObject.name={name}", _request_timeout=30
        )
        return [f"WARNING: Event retrieved from the cluster: {e.reason}: {e.message}" for e in events.items]

    def _run_stages(self, name: str, job: Job, log_reader: LogReader, result: JobResult) -> None:
        scripts = {
            "prepare_script": "echo Running on $(hostname) via socialweb-computer...",
            "get_sources": "mkdir -p /builds/project && cd /builds/project && echo Fetching changes...",
            "step_script": job.script,
            "after_script": job.after_script,
        }
        codes: dict[str, int] = {}
        for stage in STAGES:
            cancel_after = job.cancel_after if stage == "step_script" else 0.0
            codes[stage] = self._run_stage(name, stage, scripts[stage], log_reader, result, cancel_after)
            if stage in ("prepare_script", "get_sources") and codes[stage]:
                break
        failed = next((code for stage, code in codes.items() if stage != "after_script" and code), 0)
        result.exit_code = codes.get("step_script", failed)
        if failed:
            result.status, result.message = "failed", f"ERROR: Job failed: exit code {failed}"
        else:
            result.status, result.message = "success", "Job succeeded"

    def _run_stage(
        self, name: str, stage: str, body: str, log_reader: LogReader, result: JobResult, cancel_after: float
    ) -> int:
        """Writes the stage's script, starts it through the build shell's stdin, follows its log."""
        path = f"{self.scripts_dir}/{stage}"
        script = _stage_script(path, body).encode()
        self.exec("helper", name, ["sh", "-c", f"cat > {path} && chmod 755 {path}"], stdin=script)
        self.attach_stdin(name, "build", f"setsid {path} >> {self.log_path} 2>&1 &\n")
        cancel_at = time.monotonic() + cancel_after if cancel_after else 0.0
        canceled = False
        while True:
            wait = max(0.1, cancel_at - time.monotonic()) if cancel_at and not canceled else 600.0
            line = log_reader.next_line(wait)
            if line is None:
                if cancel_at and not canceled:
                    # The cancellation: the stage's whole process group gets SIGTERM.
                    self.exec("build", name, ["sh", "-c", f"kill -s TERM -$(cat {path}.pid)"])
                    canceled = True
                    continue
                raise JobFailed("system failure", f"the job log of {stage} stopped without an exit status")
            code = _exit_marker(line, path)
            if code is not None:
                break
            result.log.append(line)
            if stage == "step_script" and not result.first_line:
                result.first_line = time.monotonic()
        if canceled:
            raise JobFailed("canceled", "ERROR: Job failed: canceled")
        return code

    # ------------------------------------------------------------ exec and attach

    def kubectl(
        self, *args: str, stdin: bytes | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[bytes]:
        env = {
            "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false",
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.work_dir),
        }
        return subprocess.run(
            [str(server_mod.tool_path("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            env=env,
            timeout=timeout,
        )

    def kubectl_popen(self, *args: str) -> subprocess.Popen[bytes]:
        env = {
            "KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false",
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.work_dir),
        }
        return subprocess.Popen(
            [str(server_mod.tool_path("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
        )

    def exec(self, container: str, pod: str, command: list[str], stdin: bytes | None = None) -> bytes:
        args = ["exec", "-n", self.config.namespace, pod, "-c", container]
        if stdin is not None:
            args.append("-i")
        for attempt in range(4):
            done = self.kubectl(*args, "--", *command, stdin=stdin)
            if done.returncode == 0:
                return done.stdout
            stderr = done.stderr.decode(errors="replace")
            if not any(reason in stderr for reason in RETRIED) or attempt == 3:
                raise JobFailed(
                    "system failure", f"exec {shlex.join(command)} in {container}: {stderr.strip()}"
                )
            time.sleep(1 + attempt)
        raise AssertionError("unreachable")

    def attach_stdin(self, pod: str, container: str, line: str) -> None:
        for attempt in range(4):
            try:
                asyncio.run(self._attach_stdin(pod, container, line))
                return
            except (OSError, asyncio.IncompleteReadError, spdy.SpdyError, AttachError) as exc:
                if not any(reason in str(exc) for reason in (*RETRIED, "EOF")) or attempt == 3:
                    raise JobFailed("system failure", f"attach to {container}: {exc}") from None
                time.sleep(1 + attempt)

    async def _attach_stdin(self, pod: str, container: str, line: str) -> None:
        url = urllib.parse.urlsplit(self.credential.server)
        try:
            reader, writer = await asyncio.open_connection(
                url.hostname, url.port, ssl=self.credential.ssl_context()
            )
        except ConnectionRefusedError as exc:
            raise AttachError(f"connection refused: {exc}") from None
        target = (
            f"/api/v1/namespaces/{self.config.namespace}/pods/{pod}/attach?container={container}&stdin=true"
        )
        headers = (
            [
                ("Host", url.netloc),
                ("User-Agent", f"gitlab-runner {GITLAB_RUNNER_VERSION} (test double)"),
                ("Content-Length", "0"),
                ("Connection", "Upgrade"),
                ("Upgrade", "SPDY/3.1"),
            ]
            + [("X-Stream-Protocol-Version", f"{v}.channel.k8s.io") for v in ("v5", "v4", "v3", "v2")]
            + [("X-Stream-Protocol-Version", "channel.k8s.io")]
        )
        writer.write(netio.request_head("POST", target, headers))
        try:
            code, _head = await netio.read_response_head(reader)
        except asyncio.IncompleteReadError:
            raise AttachError("unexpected EOF before the upgrade") from None
        if code != 101:
            body = await reader.read(64 << 10)
            writer.close()
            raise AttachError(f"{code}: {body.decode(errors='replace')}")
        session = spdy.Session(reader, writer)
        session.start()
        try:
            error = await session.open({"streamtype": "error"})
            stdin = await session.open({"streamtype": "stdin"})
            await stdin.write(line.encode())
            await stdin.close()
            body = b"".join([chunk async for chunk in error])
        finally:
            await session.close()
        if body:
            status = json.loads(body)
            if status.get("status") != "Success":
                raise AttachError(status.get("message", body.decode(errors="replace")))


class AttachError(Exception):
    pass


def _stage_script(path: str, body: str) -> str:
    # As the runner's generated scripts: the exit status goes into the log through a trap; the
    # process group is the stage's, so a cancellation reaches what the script started.
    marker = f'echo "{{\\"command_exit_code\\": $?, \\"script\\": \\"{path}\\"}}"'
    return f"#!/bin/sh\necho $$ > {path}.pid\ntrap 'exit 143' TERM\ntrap '{marker}' EXIT\nset -e\n{body}\n"


def _exit_marker(line: str, path: str) -> int | None:
    if not line.startswith('{"command_exit_code"'):
        return None
    with contextlib.suppress(ValueError):
        marker = json.loads(line)
        if marker.get("script") == path:
            return int(marker["command_exit_code"])
    return None


class LogReader:
    """`read-logs` in the helper, reopened from the last offset whenever its connection ends."""

    def __init__(self, runner: Runner, pod: str, drop_after_lines: int) -> None:
        self.runner, self.pod = runner, pod
        self.lines: queue.Queue[str] = queue.Queue()
        self.offset = 0
        self.reconnects = 0
        self._drop_after = drop_after_lines
        self._stopped = threading.Event()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._follow, name=f"read-logs {pod}", daemon=True)
        self._thread.start()

    def next_line(self, timeout: float) -> str | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> None:
        self._stopped.set()
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        self._thread.join(timeout=30)

    def _follow(self) -> None:
        seen = 0
        while not self._stopped.is_set():
            self._process = self.runner.kubectl_popen(
                "exec",
                "-n",
                self.runner.config.namespace,
                self.pod,
                "-c",
                "helper",
                "--",
                "gitlab-runner-helper",
                "read-logs",
                "--path",
                self.runner.log_path,
                "--offset",
                str(self.offset),
                "--wait-file-timeout",
                "1m0s",
            )
            assert self._process.stdout is not None
            for raw in self._process.stdout:
                offset, _, text = raw.decode(errors="replace").rstrip("\n").partition(" ")
                self.offset = int(offset)
                self.lines.put(text)
                seen += 1
                if self._drop_after and seen == self._drop_after:
                    self._process.kill()  # the dropped connection; the loop reopens at self.offset
                    break
            self._process.wait()
            if self._stopped.is_set():
                return
            self.reconnects += 1
            time.sleep(0.5)
