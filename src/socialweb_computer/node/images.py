"""Image pulls as a kubelet makes them: pull policy, pull secrets, back-off and events.

`ensure()` answers "may this container start, and with which image reference?". It pulls
when the policy says so (Always; IfNotPresent and absent; Never never pulls), with the
credentials of the pod's `imagePullSecrets` for that registry, and remembers failures per
(pod, image) so that the next attempt waits (10 s doubling to 5 min): while it waits the
container shows `ImagePullBackOff`, right after a failure `ErrImagePull`, both with the
registry's message, as `kubectl describe` users expect.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from typing import Any

import orjson

from socialweb_computer.node.cri import runtime as cri
from socialweb_computer.node.cri.generated import api_pb2 as api

Object = dict[str, Any]
INITIAL_BACKOFF = 10.0
MAX_BACKOFF = 300.0
DOCKER_HUB = "docker.io"
_DOCKER_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")


class PullError(Exception):
    """The container may not start yet: `reason` is its waiting reason, `message` the why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclasses.dataclass
class _Backoff:
    delay: float
    until: float
    message: str


def registry_host(image: str) -> str:
    """The registry an image reference names, as Docker's reference rules read it."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def has_tag_or_digest(image: str) -> bool:
    last = image.rsplit("/", 1)[-1]
    return "@" in last or ":" in last


def pull_policy(container: Object) -> str:
    policy = container.get("imagePullPolicy")
    if policy:
        return str(policy)
    image = container.get("image", "")
    return "Always" if not has_tag_or_digest(image) or image.endswith(":latest") else "IfNotPresent"


def _host_of_key(key: str) -> str:
    key = key.removeprefix("https://").removeprefix("http://")
    return key.split("/", 1)[0]


def auth_for(image: str, secrets: list[Object]) -> api.AuthConfig | None:
    """Credentials for the image's registry from dockerconfigjson/dockercfg Secrets (first match)."""
    host = registry_host(image)
    for secret in secrets:
        data = secret.get("data") or {}
        raw = data.get(".dockerconfigjson") or data.get(".dockercfg")
        if not raw:
            continue
        try:
            document = orjson.loads(base64.b64decode(raw))
        except (ValueError, orjson.JSONDecodeError):
            continue
        auths = document.get("auths", document) if isinstance(document, dict) else {}
        for key, entry in auths.items():
            key_host = _host_of_key(key)
            if key_host == host or (host == DOCKER_HUB and key in _DOCKER_HUB_KEYS):
                if not isinstance(entry, dict):
                    continue
                username, password = entry.get("username", ""), entry.get("password", "")
                if entry.get("auth") and not username:
                    decoded = base64.b64decode(entry["auth"]).decode(errors="replace")
                    username, _, password = decoded.partition(":")
                # containerd parses this as a URL and sends the credentials only to its host.
                return api.AuthConfig(
                    username=username,
                    password=password,
                    server_address=f"https://{key_host}",
                    identity_token=entry.get("identitytoken", ""),
                    registry_token=entry.get("registrytoken", ""),
                )
    return None


@dataclasses.dataclass(frozen=True)
class Pulled:
    image_ref: str
    pulled: bool  # False: already present
    seconds: float
    size: int


def node_credentials(path: Any) -> list[Object]:
    """The node's own pull credentials (a docker config.json the bidder wrote), as a pull Secret.

    Like a kubelet's node-wide `config.json`: used for a registry that none of the pod's
    `imagePullSecrets` names.
    """
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    return [{"data": {".dockerconfigjson": base64.b64encode(raw).decode()}}]


class ImageManager:
    def __init__(
        self, runtime: cri.Runtime, *, clock: Any = time.monotonic, node_secrets: list[Object] | None = None
    ) -> None:
        self.runtime = runtime
        self.clock = clock
        self.node_secrets = list(node_secrets or [])
        self._backoff: dict[tuple[str, str], _Backoff] = {}

    def in_backoff(self, pod_uid: str, image: str) -> _Backoff | None:
        entry = self._backoff.get((pod_uid, image))
        return entry if entry is not None and self.clock() < entry.until else None

    def backoff_remaining(self, pod_uid: str, image: str) -> float:
        entry = self._backoff.get((pod_uid, image))
        return max(0.0, entry.until - self.clock()) if entry else 0.0

    async def ensure(
        self,
        pod_uid: str,
        container: Object,
        secrets: list[Object],
        sandbox_config: api.PodSandboxConfig | None,
        *,
        on_pull_start: Any = None,
    ) -> Pulled:
        image = container.get("image", "")
        policy = pull_policy(container)
        present = await self.runtime.image_status(image)
        if present is not None and policy != "Always":
            return Pulled(present.id, False, 0.0, int(present.size))
        if policy == "Never":
            raise PullError(
                "ErrImageNeverPull", f'Container image "{image}" is not present with pull policy of Never'
            )
        waiting = self.in_backoff(pod_uid, image)
        if waiting is not None:
            raise PullError("ImagePullBackOff", f'Back-off pulling image "{image}": {waiting.message}')
        if on_pull_start is not None:
            on_pull_start()
        started = time.monotonic()
        try:
            auth = auth_for(image, secrets) or auth_for(image, self.node_secrets)
            ref = await self.runtime.pull_image(image, auth, sandbox_config)
        except cri.CriError as exc:
            previous = self._backoff.get((pod_uid, image))
            delay = INITIAL_BACKOFF if previous is None else min(previous.delay * 2, MAX_BACKOFF)
            self._backoff[(pod_uid, image)] = _Backoff(delay, self.clock() + delay, exc.message)
            raise PullError("ErrImagePull", exc.message) from None
        self._backoff.pop((pod_uid, image), None)
        status = await self.runtime.image_status(ref)
        return Pulled(ref, True, time.monotonic() - started, int(status.size) if status else 0)

    def forget(self, pod_uid: str) -> None:
        for key in [k for k in self._backoff if k[0] == pod_uid]:
            del self._backoff[key]
