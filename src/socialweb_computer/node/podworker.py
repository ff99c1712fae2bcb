"""One worker per pod: the kubelet's syncPod loop for the pods bound to this node.

A worker wakes when its pod changes in the API, when the runtime reports a change (PLEG),
when a probe result changes, when a back-off or deadline expires, and every resync
period. Each pass (`sync`) refreshes the pod's runtime state first and then does what is
due, in a kubelet's order:

1. a pod being deleted is killed within its grace period (preStop hooks, SIGTERM, then
   SIGKILL; regular containers before sidecars), its final status is posted, the API
   object is deleted with grace 0 and the node's resources are released; the worker ends;
2. a pod past `activeDeadlineSeconds` fails with DeadlineExceeded; a pod whose disk
   emptyDir outgrew its `sizeLimit` is evicted;
3. volumes, then the sandbox (re-created when it died), then init containers one at a
   time (sidecars, `restartPolicy: Always`, start and stay), then the regular containers;
   ended containers are restarted per `restartPolicy` with a kubelet's back-off
   (10 s doubling to 5 min: CrashLoopBackOff), failed liveness or startup probes restart;
4. the status is posted when it changed; a pod that has finished (Succeeded/Failed) has
   its sidecars and sandbox stopped, and its containers kept for `kubectl logs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import time
from pathlib import Path
from typing import Any

from socialweb_computer.api import gofmt
from socialweb_computer.client import rest
from socialweb_computer.node import envvars, events, images, pleg, podspec, podstatus, probes, volumes
from socialweb_computer.node import services as services_mod
from socialweb_computer.node.cri import runtime as cri
from socialweb_computer.node.cri.generated import api_pb2 as api

log = logging.getLogger(__name__)

Object = dict[str, Any]
RESYNC_SECONDS = 10.0
INITIAL_RESTART_BACKOFF = 10.0
MAX_RESTART_BACKOFF = 300.0
MIN_GRACE_SECONDS = 2
MAX_TERMINATION_MESSAGE = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
SERVICES_SYNC_SECONDS = 10.0


@dataclasses.dataclass
class Services:
    """What every pod worker shares (built by the agent)."""

    client: rest.Client
    runtime: cri.Runtime
    pleg: pleg.Pleg
    images: images.ImageManager
    recorder: events.Recorder
    settings: podspec.NodeSettings
    pods_dir: Path
    host_ip: str
    allocatable: dict[str, str]
    # The cluster's Services (node/services.py); None on a node without in-cluster networking.
    service_table: services_mod.ServiceTable | None = None

    async def service_environment(self, pod: Object) -> dict[str, str]:
        """The Service variables of the pod's containers; waits (briefly) for the first read."""
        if self.service_table is None:
            return {}
        if not self.service_table.synced:
            await self.service_table.wait_synced(SERVICES_SYNC_SECONDS)
        enable = (pod.get("spec") or {}).get("enableServiceLinks", True) is not False
        try:
            return self.service_table.service_environment(pod["metadata"].get("namespace", ""), enable)
        except services_mod.NotSynced as exc:
            raise envvars.ConfigError(str(exc)) from None

    async def lookup(self, kind: str, namespace: str, name: str) -> Object | None:
        plural = {"ConfigMap": "configmaps", "Secret": "secrets"}[kind]
        try:
            return await self.client.get(rest.path_of("v1", plural, namespace, name))
        except rest.ApiError as exc:
            if exc.not_found:
                return None
            raise envvars.ConfigError(f"failed to get {kind.lower()} {namespace}/{name}: {exc}") from None

    async def request_token(
        self, pod: Object, account: str, seconds: int, audience: str
    ) -> tuple[str, float]:
        meta = pod["metadata"]
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                # No audience in the volume, none in the request: the API's own (NodeRestriction
                # refuses an audience the pod's volumes do not name).
                **({"audiences": [audience]} if audience else {}),
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        try:
            reply = await self.client.create(
                rest.path_of("v1", "serviceaccounts", meta.get("namespace", ""), account, "token"), body
            )
        except rest.ApiError as exc:
            raise envvars.ConfigError(f"failed to fetch token: {exc}") from None
        status = reply.get("status") or {}
        expires = status.get("expirationTimestamp")
        when = (
            datetime.datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp()
            if expires
            else time.time() + seconds
        )
        return str(status.get("token", "")), when


@dataclasses.dataclass
class _Backoff:
    delay: float
    last_update: float  # wall clock


def _now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _rpc_error(exc: cri.CriError) -> str:
    return f"rpc error: code = {exc.code.name.title().replace('_', '')} desc = {exc.message}"


class PodWorker:
    def __init__(self, services: Services, pod: Object) -> None:
        self.s = services
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.removed = False  # gone from the API without us (force delete)
        self.finished = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._deadline: float | None = None  # the next time something is due (monotonic)
        self.waiting: dict[str, tuple[str, str]] = {}
        self.ready: dict[str, bool] = {}
        self.started: dict[str, bool] = {}
        self.terminal: tuple[str, str, str] | None = None
        self.messages: dict[str, str] = {}
        self.backoff: dict[str, _Backoff] = {}
        self.probers: dict[tuple[str, str], probes.Prober] = {}
        self.posted: Object | None = None
        self.start_time = (pod.get("status") or {}).get("startTime") or _now_rfc3339()
        self.volumes = volumes.PodVolumes(
            services.pods_dir,
            pod,
            lookup=services.lookup,
            tokens=services.request_token,
            allocatable=services.allocatable,
        )
        self.mounts: dict[str, Path] | None = None
        self._warned: set[str] = set()
        self._last_resync = 0.0
        self._killed_for_probe: set[str] = set()

    # ---------------------------------------------------------------- loop

    @property
    def name(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"

    @property
    def pretty(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta['name']}_{meta.get('namespace', '')}({self.uid})"

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"pod {self.name}")

    def update(self, pod: Object) -> None:
        self.pod = pod
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    def due_in(self, seconds: float) -> None:
        when = time.monotonic() + max(0.0, seconds)
        if self._deadline is None or when < self._deadline:
            self._deadline = when

    async def stop(self) -> None:
        """Stops the worker without touching the pod (agent shutdown)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._stop_probers()

    async def _run(self) -> None:
        failures = 0
        while True:
            self._wake.clear()
            self._deadline = None
            try:
                done = await self.sync()
                failures = 0
            except asyncio.CancelledError:
                raise
            except (rest.ApiError, cri.CriError, OSError, TimeoutError) as exc:
                failures += 1
                log.warning("syncing pod %s failed: %s", self.name, exc)
                done = False
                self.due_in(min(0.5 * 2**failures, 10.0))
            except Exception:
                failures += 1
                log.exception("syncing pod %s failed", self.name)
                done = False
                self.due_in(min(0.5 * 2**failures, 10.0))
            if done:
                await self._stop_probers()
                self.finished.set()
                return
            timeout = (
                RESYNC_SECONDS if self._deadline is None else max(0.0, self._deadline - time.monotonic())
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(timeout, RESYNC_SECONDS))

    # ---------------------------------------------------------------- one pass

    async def sync(self) -> bool:
        """One pass; True when the worker is done (the pod is gone and cleaned up)."""
        record = await self.s.pleg.relist(self.uid)
        meta = self.pod["metadata"]
        if self.removed:
            await self.kill_pod(record, self._grace(), finished=True)
            await self.cleanup()
            return True
        if meta.get("deletionTimestamp"):
            return await self._delete(record)
        if self.terminal is not None or self._phase(record) in ("Succeeded", "Failed"):
            await self._settle_finished(record)
            return False
        if self._deadline_exceeded():
            self.terminal = (
                "Failed",
                "DeadlineExceeded",
                "Pod was active on the node longer than the specified deadline",
            )
            self._event(events.WARNING, "DeadlineExceeded", self.terminal[2])
            await self._settle_finished(await self.kill_pod(record, self._grace()))
            return False
        if self.mounts is not None:
            overuse = self.volumes.empty_dir_overuse()
            if overuse:
                self.terminal = ("Failed", "Evicted", overuse[0])
                self._event(events.WARNING, "Evicted", overuse[0])
                await self._settle_finished(await self.kill_pod(record, self._grace()))
                return False
        if not await self._ensure_volumes():
            await self._post(record)
            return False
        sandbox = await self._ensure_sandbox(record)
        if sandbox is None:
            await self._post(await self.s.pleg.relist(self.uid))
            return False
        record = await self.s.pleg.relist(self.uid)
        if await self._run_init_containers(record, sandbox):
            record = await self.s.pleg.relist(self.uid)
            await self._run_containers(record, sandbox)
        record = await self.s.pleg.relist(self.uid)
        if self._phase(record) in ("Succeeded", "Failed"):
            # Sidecars and the sandbox stop before the terminal phase is posted (as a kubelet does).
            await self._settle_finished(record)
        else:
            await self._post(record)
        return False

    def _grace(self) -> int:
        meta = self.pod["metadata"]
        value = meta.get("deletionGracePeriodSeconds")
        if value is None:
            value = (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        return int(value)

    def _deadline_exceeded(self) -> bool:
        deadline = (self.pod.get("spec") or {}).get("activeDeadlineSeconds")
        if deadline is None:
            return False
        remaining = _parse_time(self.start_time) + int(deadline) - time.time()
        if remaining <= 0:
            return True
        self.due_in(remaining)
        return False

    # ---------------------------------------------------------------- events

    def _ref(self, container: str = "", kind: str = "") -> Object:
        field = ""
        if container:
            field = f"spec.{kind or self._container_field(container)}{{{container}}}"
        return events.reference(self.pod, field)

    def _container_field(self, name: str) -> str:
        spec = self.pod.get("spec") or {}
        for field in ("initContainers", "containers", "ephemeralContainers"):
            if any(c.get("name") == name for c in spec.get(field) or []):
                return field
        return "containers"

    def _event(self, type_: str, reason: str, message: str, container: str = "") -> None:
        self.s.recorder.event(self._ref(container), type_, reason, message)

    # ---------------------------------------------------------------- volumes and sandbox

    async def _ensure_volumes(self) -> bool:
        now = time.monotonic()
        try:
            if self.mounts is None:
                self.mounts = await self.volumes.setup(self.pod)
                self._last_resync = now
            elif now - self._last_resync >= RESYNC_SECONDS:
                self._last_resync = now
                await self.volumes.refresh(self.pod)
        except volumes.MountError as exc:
            self._event(events.WARNING, "FailedMount", str(exc))
            for container in podspec.all_containers(self.pod):
                self.waiting.setdefault(container["name"], ("ContainerCreating", ""))
            self.due_in(2.0)
            return False
        return True

    async def _ensure_sandbox(self, record: pleg.PodRecord) -> pleg.Sandbox | None:
        latest = record.latest_sandbox()
        if latest is not None and latest.ready:
            return latest
        policy = (self.pod.get("spec") or {}).get("restartPolicy", "Always")
        if latest is not None:
            if policy == "Never" and record.instances and all(i.exited for i in self._newest(record)):
                return None  # the pod has run and will not run again
            self._event(
                events.NORMAL, "SandboxChanged", "Pod sandbox changed, it will be killed and re-created."
            )
            await self.kill_pod(record, self._grace(), stop_sandbox=True)
        _, fell_back = podspec.effective_dns_policy(self.pod, self.s.settings)
        if fell_back and "dns" not in self._warned:
            self._warned.add("dns")
            self._event(
                events.WARNING,
                "MissingClusterDNS",
                f'pod: "{self.pretty}". kubelet does not have ClusterDNS IP configured and cannot create '
                'Pod using "ClusterFirst" policy. Falling back to "Default" policy.',
            )
        attempt = (latest.attempt + 1) if latest is not None else 0
        config = podspec.sandbox_config(self.pod, self.s.settings, attempt)
        podspec.pod_log_dir(self.s.settings, self.pod).mkdir(parents=True, exist_ok=True)
        try:
            sandbox_id = await self.s.runtime.run_pod_sandbox(config)
        except cri.CriError as exc:
            self._event(
                events.WARNING, "FailedCreatePodSandBox", f"Failed to create pod sandbox: {_rpc_error(exc)}"
            )
            self.due_in(5.0)
            return None
        status = await self.s.runtime.pod_sandbox_status(sandbox_id)
        self._write_etc_hosts([status.network.ip] if status.network.ip else [])
        self.s.pleg.poke()
        return pleg.Sandbox(sandbox_id, attempt, True, status.created_at, status.network.ip)

    def _etc_hosts_path(self) -> Path:
        return self.s.pods_dir / self.uid / "etc-hosts"

    def _write_etc_hosts(self, ips: list[str]) -> None:
        path = self._etc_hosts_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(podspec.etc_hosts(self.pod, self.s.settings, ips))
        path.chmod(0o644)

    # ---------------------------------------------------------------- containers

    @staticmethod
    def _newest(record: pleg.PodRecord) -> list[pleg.Instance]:
        seen: set[str] = set()
        out = []
        for instance in record.instances:
            if instance.name not in seen:
                seen.add(instance.name)
                out.append(instance)
        return out

    def _latest(self, record: pleg.PodRecord, name: str) -> pleg.Instance | None:
        instances = record.of(name)
        return instances[0] if instances else None

    async def _run_init_containers(self, record: pleg.PodRecord, sandbox: pleg.Sandbox) -> bool:
        """Advances initialization; True when every init container is done (or started, for sidecars)."""
        spec = self.pod.get("spec") or {}
        main_started = any(record.of(c["name"]) for c in spec.get("containers") or [])
        for container in spec.get("initContainers") or []:
            name = container["name"]
            current = self._latest(record, name)
            if podstatus.is_sidecar(container):
                if current is not None and current.running:
                    if self._probe_killed(container, current):
                        await self._restart_or_wait(container, current, sandbox, init=True)
                        return False
                    if not self.started.get(current.id, "startupProbe" not in container) and not main_started:
                        return False
                    continue
                if not await self._restart_or_wait(container, current, sandbox, init=True):
                    return False
                if not main_started:
                    return False
                continue
            if main_started:
                continue  # initialization happened before; never rerun it
            if current is not None and current.exited and current.exit_code == 0:
                continue
            if current is not None and current.running:
                return False
            if current is not None and current.exited:
                if (spec.get("restartPolicy") or "Always") == "Never":
                    return False  # the pod fails (phase computes it)
                await self._restart_or_wait(container, current, sandbox, init=True)
                return False
            await self._start(container, sandbox, init=True)
            return False
        return True

    async def _run_containers(self, record: pleg.PodRecord, sandbox: pleg.Sandbox) -> None:
        spec = self.pod.get("spec") or {}
        for container in spec.get("containers") or []:
            current = self._latest(record, container["name"])
            if current is not None and current.running:
                if self._probe_killed(container, current):
                    await self._restart_or_wait(container, current, sandbox, init=False)
                continue
            if current is None or podstatus.will_restart(self.pod, container, current, init=False):
                await self._restart_or_wait(container, current, sandbox, init=False)
        for container in spec.get("ephemeralContainers") or []:
            if self._latest(record, container["name"]) is None and container["name"] not in self.waiting:
                await self._start(container, sandbox, init=False)

    def _probe_killed(self, container: Object, current: pleg.Instance) -> bool:
        """Whether a liveness or startup probe has failed for the running instance (restart it)."""
        for kind in ("liveness", "startup"):
            prober = self.probers.get((current.id, kind))
            if prober is not None and prober.result is False:
                return True
        return False

    async def _restart_or_wait(
        self, container: Object, current: pleg.Instance | None, sandbox: pleg.Sandbox, *, init: bool
    ) -> bool:
        """Starts the container now or, within its back-off, reports CrashLoopBackOff. True if started."""
        name = container["name"]
        if current is not None and current.running:
            await self.kill_container(
                current, container, self._kill_grace(container), self._probe_message(container, current)
            )
            current = self._latest(await self.s.pleg.relist(self.uid), name)
        if current is not None:
            finished = current.finished_at / 1e9 if current.finished_at else time.time()
            entry = self.backoff.get(name)
            if (
                entry is not None
                and finished - entry.last_update <= MAX_RESTART_BACKOFF
                and time.time() - finished < entry.delay
            ):
                remaining = entry.delay - (time.time() - finished)
                self.waiting[name] = (
                    "CrashLoopBackOff",
                    f"back-off {gofmt.duration(entry.delay)} restarting failed "
                    f"container={name} pod={self.pretty}",
                )
                self._event(
                    events.WARNING,
                    "BackOff",
                    f"Back-off restarting failed container {name} in pod {self.pretty}",
                    name,
                )
                self.due_in(remaining)
                return False
            now = time.time()
            if entry is None or now - entry.last_update > MAX_RESTART_BACKOFF:
                self.backoff[name] = _Backoff(INITIAL_RESTART_BACKOFF, now)
            else:
                self.backoff[name] = _Backoff(min(entry.delay * 2, MAX_RESTART_BACKOFF), now)
        return await self._start(
            container, sandbox, init=init, attempt=(current.attempt + 1) if current else 0
        )

    def _probe_message(self, container: Object, current: pleg.Instance) -> str:
        for kind in ("liveness", "startup"):
            prober = self.probers.get((current.id, kind))
            if prober is not None and prober.result is False:
                return f"Container {container['name']} failed {kind} probe, will be restarted"
        return ""

    def _kill_grace(self, container: Object) -> int:
        for kind in ("livenessProbe", "startupProbe"):
            probe = container.get(kind) or {}
            if probe.get("terminationGracePeriodSeconds") is not None:
                return int(probe["terminationGracePeriodSeconds"])
        return int((self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))

    async def _pull_secrets(self) -> list[Object]:
        namespace = self.pod["metadata"].get("namespace", "")
        secrets, missing = [], []
        for ref in (self.pod.get("spec") or {}).get("imagePullSecrets") or []:
            try:
                found = await self.s.lookup("Secret", namespace, ref.get("name", ""))
            except envvars.ConfigError:
                found = None
            if found is None:
                missing.append(ref.get("name", ""))
            else:
                secrets.append(found)
        if missing and "pull-secrets" not in self._warned:
            self._warned.add("pull-secrets")
            self._event(
                events.WARNING,
                "FailedToRetrieveImagePullSecret",
                f"Unable to retrieve some image pull secrets ({', '.join(missing)}); attempting to pull the "
                "image may not succeed.",
            )
        return secrets

    async def _start(self, container: Object, sandbox: pleg.Sandbox, *, init: bool, attempt: int = 0) -> bool:
        name = container["name"]
        image = container.get("image", "")
        sandbox_config = podspec.sandbox_config(self.pod, self.s.settings, sandbox.attempt)

        def pulling() -> None:
            self._event(events.NORMAL, "Pulling", f'Pulling image "{image}"', name)

        try:
            pulled = await self.s.images.ensure(
                self.uid, container, await self._pull_secrets(), sandbox_config, on_pull_start=pulling
            )
        except images.PullError as exc:
            self._pull_failed(name, image, exc)
            return False
        if pulled.pulled:
            took = gofmt.duration(round(pulled.seconds, 3))
            self._event(
                events.NORMAL,
                "Pulled",
                f'Successfully pulled image "{image}" in {took} ({took} including '
                f"waiting). Image size: {pulled.size} bytes.",
                name,
            )
        else:
            self._event(
                events.NORMAL, "Pulled", f'Container image "{image}" already present on machine', name
            )
        try:
            config = await self._container_config(container, sandbox, attempt, pulled.image_ref)
        except (envvars.ConfigError, podspec.RunAsRootError) as exc:
            self.waiting[name] = ("CreateContainerConfigError", str(exc))
            self._event(events.WARNING, "Failed", f"Error: {exc}", name)
            self.due_in(5.0)
            return False
        try:
            container_id = await self.s.runtime.create_container(sandbox.id, config, sandbox_config)
        except cri.CriError as exc:
            self.waiting[name] = ("CreateContainerError", exc.message)
            self._event(events.WARNING, "Failed", f"Error: {exc.message}", name)
            self.due_in(5.0)
            return False
        self._event(events.NORMAL, "Created", f"Created container: {name}", name)
        try:
            await self.s.runtime.start_container(container_id)
        except cri.CriError as exc:
            self.waiting.pop(name, None)
            self._event(events.WARNING, "Failed", f"Error: {exc.message}", name)
            self.s.pleg.poke()
            return False
        self._event(events.NORMAL, "Started", f"Started container {name}", name)
        self.waiting.pop(name, None)
        self.s.pleg.poke()
        self._start_probers(container, container_id)
        post_start = (container.get("lifecycle") or {}).get("postStart")
        if post_start:
            ok, _ = await probes.run_handler(
                post_start,
                runtime=self.s.runtime,
                container_id=container_id,
                container=container,
                pod_ip=sandbox.ip,
                timeout=self._kill_grace(container),
            )
            if not ok:
                self._event(events.WARNING, "FailedPostStartHook", "PostStartHook failed", name)
                instance = self._latest(await self.s.pleg.relist(self.uid), name)
                if instance is not None:
                    await self.kill_container(
                        instance, container, self._kill_grace(container), "FailedPostStartHook"
                    )
                return False
        return True

    def _pull_failed(self, name: str, image: str, exc: images.PullError) -> None:
        self.waiting[name] = (exc.reason, exc.message)
        if exc.reason == "ErrImagePull":
            self._event(events.WARNING, "Failed", f'Failed to pull image "{image}": {exc.message}', name)
            self._event(events.WARNING, "Failed", "Error: ErrImagePull", name)
        elif exc.reason == "ImagePullBackOff":
            self._event(events.NORMAL, "BackOff", f'Back-off pulling image "{image}"', name)
            self._event(events.WARNING, "Failed", "Error: ImagePullBackOff", name)
        else:
            self._event(events.WARNING, exc.reason, exc.message, name)
        self.due_in(max(1.0, self.s.images.backoff_remaining(self.uid, image)))

    async def _container_config(
        self, container: Object, sandbox: pleg.Sandbox, attempt: int, image_ref: str
    ) -> api.ContainerConfig:
        view = self._pod_view(sandbox.ip)
        env, warnings = await envvars.environment(
            view,
            container,
            lookup=self.s.lookup,
            allocatable=self.s.allocatable,
            service_env=await self.s.service_environment(self.pod),
        )
        for warning in warnings:
            self._event(events.WARNING, "InvalidEnvironmentVariableNames", warning, container["name"])
        image = await self.s.runtime.image_status(image_ref)
        image_uid = image.uid.value if image is not None and image.HasField("uid") else None
        podspec.verify_run_as_non_root(self.pod, container, image_uid, image.username if image else "")
        command, args = envvars.command_and_args(container, env)
        env_map = dict(env)
        try:
            mounts = podspec.mounts(container, self.mounts or {}, env_map)
        except KeyError as exc:
            raise envvars.ConfigError(
                f"cannot find volume {exc.args[0]!r} to mount into container {container['name']!r}"
            ) from None
        spec = self.pod.get("spec") or {}
        target_id = ""
        if container.get("targetContainerName"):
            target_name = container["targetContainerName"]
            target = self._latest(self.s.pleg.pod(self.uid), target_name)
            if target is None or not target.running:
                raise envvars.ConfigError(f'target container "{target_name}" is not running')
            target_id = target.id
        if not spec.get("hostNetwork") and not any(m.container_path == "/etc/hosts" for m in mounts):
            if not self._etc_hosts_path().exists():
                self._write_etc_hosts([sandbox.ip] if sandbox.ip else [])
            mounts.append(api.Mount(container_path="/etc/hosts", host_path=str(self._etc_hosts_path())))
        message_path = container.get("terminationMessagePath", "/dev/termination-log")
        if message_path:
            log_dir = self.s.pods_dir / self.uid / "containers" / container["name"]
            log_dir.mkdir(parents=True, exist_ok=True)
            log_file = log_dir / f"{attempt:08x}"
            log_file.touch()
            log_file.chmod(0o666)
            mounts.append(api.Mount(container_path=message_path, host_path=str(log_file)))
        podspec.pod_log_dir(self.s.settings, self.pod).joinpath(container["name"]).mkdir(
            parents=True, exist_ok=True
        )
        return api.ContainerConfig(
            metadata=api.ContainerMetadata(name=container["name"], attempt=attempt),
            image=api.ImageSpec(image=image_ref, user_specified_image=container.get("image", "")),
            command=command,
            args=args,
            working_dir=container.get("workingDir", ""),
            envs=[api.KeyValue(key=k, value=v) for k, v in env],
            mounts=mounts,
            labels=podspec.container_labels(self.pod, container),
            annotations=podspec.container_annotations(self.pod, container, attempt),
            log_path=f"{container['name']}/{attempt}.log",
            stdin=bool(container.get("stdin")),
            stdin_once=bool(container.get("stdinOnce")),
            tty=bool(container.get("tty")),
            linux=api.LinuxContainerConfig(
                resources=podspec.container_resources(self.pod, container, self.s.settings.memory_capacity),
                security_context=podspec.container_security(self.pod, container, target_id=target_id),
            ),
        )

    def _pod_view(self, pod_ip: str) -> Object:
        """The pod as field references see it: this node's IPs, even before the status is posted."""
        status = dict(self.pod.get("status") or {})
        status.update(hostIP=self.s.host_ip, hostIPs=[{"ip": self.s.host_ip}])
        if pod_ip:
            status.update(podIP=pod_ip, podIPs=[{"ip": pod_ip}])
        return {**self.pod, "status": status}

    # ---------------------------------------------------------------- probes

    def _start_probers(self, container: Object, container_id: str) -> None:
        name = container["name"]
        for kind, field in (
            ("startup", "startupProbe"),
            ("liveness", "livenessProbe"),
            ("readiness", "readinessProbe"),
        ):
            probe = container.get(field)
            if not probe:
                continue

            async def run(timeout: float, probe: Object = probe, kind: str = kind) -> tuple[bool, str]:
                if kind != "startup" and "startupProbe" in container and not self.started.get(container_id):
                    return True, ""  # nothing but the startup probe runs until it succeeds
                return await probes.run_handler(
                    probe,
                    runtime=self.s.runtime,
                    container_id=container_id,
                    container=container,
                    pod_ip=self._sandbox_ip(),
                    timeout=timeout,
                )

            prober = probes.Prober(
                kind,
                probe,
                run,
                lambda kind, ok, message, cid=container_id: self._probe_result(cid, kind, ok),
                lambda kind, message, name=name: self._probe_failed(name, kind, message),
            )
            self.probers[(container_id, kind)] = prober
            prober.start(f"{kind} probe {self.name}/{name}")

    def _sandbox_ip(self) -> str:
        sandbox = self.s.pleg.pod(self.uid).latest_sandbox()
        return sandbox.ip if sandbox is not None else ""

    def _probe_result(self, container_id: str, kind: str, ok: bool) -> None:
        if kind == "readiness":
            self.ready[container_id] = ok
        elif kind == "startup":
            self.started[container_id] = ok
        self.wake()

    def _probe_failed(self, name: str, kind: str, message: str) -> None:
        self._event(events.WARNING, "Unhealthy", f"{kind.capitalize()} probe failed: {message}", name)

    async def _stop_probers(self, container_id: str = "") -> None:
        keys = [k for k in self.probers if not container_id or k[0] == container_id]
        for key in keys:
            await self.probers.pop(key).stop()

    # ---------------------------------------------------------------- stopping

    async def kill_container(
        self, instance: pleg.Instance, container: Object | None, grace: int, message: str = ""
    ) -> None:
        await self._stop_probers(instance.id)
        self.ready.pop(instance.id, None)
        if instance.running:
            self._event(
                events.NORMAL, "Killing", message or f"Stopping container {instance.name}", instance.name
            )
            started = time.monotonic()
            pre_stop = ((container or {}).get("lifecycle") or {}).get("preStop")
            if pre_stop and grace > 0:
                try:
                    ok, _ = await asyncio.wait_for(
                        probes.run_handler(
                            pre_stop,
                            runtime=self.s.runtime,
                            container_id=instance.id,
                            container=container or {},
                            pod_ip=self._sandbox_ip(),
                            timeout=grace,
                        ),
                        grace,
                    )
                except TimeoutError:
                    ok = True
                if not ok:
                    self._event(events.WARNING, "FailedPreStopHook", "PreStopHook failed", instance.name)
            remaining = max(MIN_GRACE_SECONDS, int(grace - (time.monotonic() - started)))
            try:
                await self.s.runtime.stop_container(instance.id, remaining)
            except cri.CriError as exc:
                if not exc.not_found:
                    raise
        self.s.pleg.poke()

    async def kill_pod(
        self, record: pleg.PodRecord, grace: int, *, stop_sandbox: bool = True, finished: bool = False
    ) -> pleg.PodRecord:
        """Stops every running container (regular ones first, then sidecars in reverse order)."""
        await self._stop_probers()
        specs = {c["name"]: c for c in podspec.all_containers(self.pod)}
        newest = [i for i in self._newest(record) if i.running]
        sidecar_order = [
            c["name"]
            for c in (self.pod.get("spec") or {}).get("initContainers") or []
            if podstatus.is_sidecar(c)
        ]
        regular = [i for i in newest if i.name not in sidecar_order]
        started = time.monotonic()
        await asyncio.gather(*(self.kill_container(i, specs.get(i.name), grace) for i in regular))
        for name in reversed(sidecar_order):
            for instance in (i for i in newest if i.name == name):
                left = max(MIN_GRACE_SECONDS, int(grace - (time.monotonic() - started)))
                await self.kill_container(instance, specs.get(name), left)
        if stop_sandbox:
            for sandbox in record.sandboxes:
                if sandbox.ready:
                    try:
                        await self.s.runtime.stop_pod_sandbox(sandbox.id)
                    except cri.CriError as exc:
                        if not exc.not_found:
                            raise
        return await self.s.pleg.relist(self.uid)

    async def _settle_finished(self, record: pleg.PodRecord) -> None:
        """A finished pod: sidecars and the sandbox stopped, status final; containers kept for logs."""
        if any(i.running for i in self._newest(record)) or any(s.ready for s in record.sandboxes):
            record = await self.kill_pod(record, self._grace())
        if self.terminal is None:
            self.terminal = (self._phase(record), "", "")
        await self._post(record)

    async def _delete(self, record: pleg.PodRecord) -> bool:
        record = await self.kill_pod(record, self._grace())
        if self.terminal is None:
            newest = [
                i
                for i in self._newest(record)
                if i.name in {c["name"] for c in (self.pod.get("spec") or {}).get("containers") or []}
            ]
            succeeded = bool(newest) and all(i.exited and i.exit_code == 0 for i in newest)
            self.terminal = ("Succeeded" if succeeded else "Failed", "", "")
        with contextlib.suppress(rest.ApiError):
            await self._post(record)
        meta = self.pod["metadata"]
        try:
            await self.s.client.delete(
                rest.path_of("v1", "pods", meta.get("namespace", ""), meta["name"]),
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )
        except rest.ApiError as exc:
            if exc.status not in (404, 409):
                raise
        await self.cleanup()
        return True

    async def cleanup(self) -> None:
        """Removes everything the pod had on the node: containers, sandboxes, logs, volumes, cgroups."""
        record = await self.s.pleg.relist(self.uid)
        for instance in record.instances:
            with contextlib.suppress(cri.CriError):
                await self.s.runtime.remove_container(instance.id)
        for sandbox in record.sandboxes:
            with contextlib.suppress(cri.CriError):
                await self.s.runtime.stop_pod_sandbox(sandbox.id)
            with contextlib.suppress(cri.CriError):
                await self.s.runtime.remove_pod_sandbox(sandbox.id)
        import shutil

        shutil.rmtree(podspec.pod_log_dir(self.s.settings, self.pod), ignore_errors=True)
        self.volumes.teardown()
        remove_cgroup(podspec.pod_cgroup(self.s.settings, self.pod))
        self.s.images.forget(self.uid)
        self.s.pleg.poke()

    # ---------------------------------------------------------------- status

    def _view(self, record: pleg.PodRecord) -> podstatus.WorkerView:
        sandbox = record.latest_sandbox()
        with_startup = {c["name"] for c in podspec.all_containers(self.pod) if c.get("startupProbe")}
        with_readiness = {c["name"] for c in podspec.all_containers(self.pod) if c.get("readinessProbe")}
        return podstatus.WorkerView(
            waiting=dict(self.waiting),
            ready=dict(self.ready),
            started=dict(self.started),
            has_readiness=with_readiness,
            has_startup=with_startup,
            pod_ip=sandbox.ip if sandbox is not None else "",
            host_ip=self.s.host_ip,
            start_time=self.start_time,
            sandbox_ready=sandbox is not None and sandbox.ready,
            terminal=self.terminal,
            termination_messages=self._termination_messages(record),
        )

    def _termination_messages(self, record: pleg.PodRecord) -> dict[str, str]:
        specs = {c["name"]: c for c in podspec.all_containers(self.pod)}
        for instance in record.instances:
            if not instance.exited or instance.id in self.messages:
                continue
            container = specs.get(instance.name) or {}
            path = instance.annotations.get(podspec.TERMINATION_MESSAGE_PATH) or container.get(
                "terminationMessagePath", "/dev/termination-log"
            )
            message = ""
            host = dict(instance.mounts).get(path)
            if host:
                with contextlib.suppress(OSError), open(host, "rb") as f:
                    message = f.read(MAX_TERMINATION_MESSAGE).decode(errors="replace")
            policy = instance.annotations.get(podspec.TERMINATION_MESSAGE_POLICY) or container.get(
                "terminationMessagePolicy", "File"
            )
            if (
                not message
                and policy == "FallbackToLogsOnError"
                and instance.exit_code != 0
                and instance.log_path
            ):
                message = tail_log(instance.log_path, FALLBACK_LOG_LINES, FALLBACK_LOG_BYTES)
            self.messages[instance.id] = message
        return self.messages

    def _phase(self, record: pleg.PodRecord) -> str:
        return podstatus.pod_status(self._pod_for_status(), record, self._view(record), {})["phase"]

    def _pod_for_status(self) -> Object:
        # Conditions we posted are the previous ones, even before the API echoes them back.
        if self.posted is None:
            return self.pod
        status = dict(self.pod.get("status") or {})
        ours = {c["type"]: c for c in self.posted.get("conditions") or [] if c.get("type") in podstatus.OURS}
        status["conditions"] = [
            c for c in status.get("conditions") or [] if c.get("type") not in ours
        ] + list(ours.values())
        return {**self.pod, "status": status}

    async def _post(self, record: pleg.PodRecord) -> None:
        status = podstatus.pod_status(self._pod_for_status(), record, self._view(record), {})
        if status == self.posted:
            return
        meta = self.pod["metadata"]
        try:
            await self.s.client.patch(
                rest.path_of("v1", "pods", meta.get("namespace", ""), meta["name"], "status"),
                {"metadata": {"uid": self.uid}, "status": status},
            )
        except rest.ApiError as exc:
            if exc.not_found:
                self.removed = True
                self.wake()
                return
            raise
        self.posted = status


def tail_log(path: str, lines: int, limit: int) -> str:
    """The last `lines` lines of a CRI log file, as text, at most `limit` bytes."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return ""
    texts = []
    for raw in data.splitlines()[-lines:]:
        parts = raw.split(b" ", 3)
        if len(parts) == 4:
            texts.append(parts[3] + (b"\n" if parts[2] == b"F" else b""))
    return b"".join(texts)[-limit:].decode(errors="replace")


def remove_cgroup(path: str) -> None:
    """Removes a cgroup directory from every v1 hierarchy (and the unified one), deepest first."""
    import os

    root = Path("/sys/fs/cgroup")
    if not root.is_dir():
        return
    for hierarchy in root.iterdir():
        target = hierarchy / path.strip("/")
        if not target.is_dir():
            continue
        for directory, _subdirs, _files in sorted(os.walk(target), key=lambda e: -len(e[0])):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
