"""ServiceAccount admission: every pod runs as a ServiceAccount that exists, and gets its token.

On pod create (upstream's plugin, bound-token form): an empty `serviceAccountName` becomes
`default`; the account must exist (`pods "x" is forbidden: error looking up service account
ns/name: serviceaccount "name" not found`; the default account is waited for about a
second, since its controller creates it just after the namespace); unless the pod or the
account says `automountServiceAccountToken: false`, the pod gets the projected volume
`kube-api-access-<5 chars>` (a 3607 s token, `ca.crt` from `kube-root-ca.crt`, and the
namespace) mounted read-only at /var/run/secrets/kubernetes.io/serviceaccount in every
container that does not mount something there already; an account's imagePullSecrets are
copied to a pod that has none. An account annotated `kubernetes.io/enforce-mountable-secrets:
"true"` limits the pod to the secrets it lists. Mirror pods may reference no account,
secret or token projection.
"""

from __future__ import annotations

import asyncio
from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import admission

Object = dict[str, Any]

DEFAULT_ACCOUNT = "default"
VOLUME_PREFIX = "kube-api-access-"
MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_EXPIRATION_SECONDS = 3607
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
ENFORCE_MOUNTABLE = "kubernetes.io/enforce-mountable-secrets"
_DEFAULT_ATTEMPTS, _RETRY_SECONDS = 10, 0.1


def token_volume(name: str) -> Object:
    """TokenVolumeSource(): what the node agent fills, as a kubelet does."""
    return {
        "name": name,
        "projected": {
            "defaultMode": 420,  # what defaulting gives every projected volume
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }


class ServiceAccountAdmission(admission.BasePlugin):
    name = "ServiceAccount"

    def __init__(self, store: Any) -> None:
        self.store = store

    @staticmethod
    def _handles(request: admission.Request) -> bool:
        return (
            request.operation == admission.CREATE
            and request.is_("", "pods")
            and not request.subresource
            and isinstance(request.object, dict)
            and isinstance(request.object.get("spec"), dict)
        )

    async def admit(self, request: admission.Request) -> None:
        if not self._handles(request):
            return
        pod = request.object
        assert pod is not None
        if MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {}):
            return
        spec = pod["spec"]
        if not spec.get("serviceAccountName"):
            spec["serviceAccountName"] = spec.get("serviceAccount") or DEFAULT_ACCOUNT
        account = await self._account(request, spec["serviceAccountName"])
        if self._automount(account, spec):
            self._mount_token(spec)
        if not spec.get("imagePullSecrets") and account.get("imagePullSecrets"):
            spec["imagePullSecrets"] = [{"name": s.get("name", "")} for s in account["imagePullSecrets"]]

    async def validate(self, request: admission.Request) -> None:
        if not self._handles(request):
            return
        pod = request.object
        assert pod is not None
        spec = pod["spec"]
        if MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {}):
            self._validate_mirror(request, spec)
            return
        account = await self._account(request, spec.get("serviceAccountName") or DEFAULT_ACCOUNT)
        annotation = ((account.get("metadata") or {}).get("annotations") or {}).get(ENFORCE_MOUNTABLE, "")
        if annotation.lower() in ("true", "1", "t"):
            why = _unmountable(account, spec)
            if why:
                raise admission.forbidden(request, why)

    async def _account(self, request: admission.Request, name: str) -> Object:
        kind = self.store.registry.lookup("", "v1", "serviceaccounts")
        attempts = _DEFAULT_ATTEMPTS if name == DEFAULT_ACCOUNT else 1
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(_RETRY_SECONDS)
            try:
                return dict(await self.store.get(kind, request.namespace, name))
            except errors.StatusError as e:
                if e.code != 404:
                    raise
        raise admission.forbidden(
            request,
            f'error looking up service account {request.namespace}/{name}: serviceaccount "{name}" not found',
        )

    @staticmethod
    def _automount(account: Object, spec: Object) -> bool:
        if spec.get("automountServiceAccountToken") is not None:
            return bool(spec["automountServiceAccountToken"])
        if account.get("automountServiceAccountToken") is not None:
            return bool(account["automountServiceAccountToken"])
        return True

    @staticmethod
    def _mount_token(spec: Object) -> None:
        volumes = spec.get("volumes") or []
        existing = next(
            (
                v.get("name")
                for v in volumes
                if isinstance(v, dict) and str(v.get("name", "")).startswith(VOLUME_PREFIX)
            ),
            None,
        )
        name = existing or objects.generate_name(VOLUME_PREFIX)
        mount = {"name": name, "readOnly": True, "mountPath": MOUNT_PATH}
        needed = False
        for field in ("initContainers", "containers"):
            for container in spec.get(field) or []:
                if not isinstance(container, dict):
                    continue
                mounts = container.get("volumeMounts") or []
                if any(isinstance(m, dict) and m.get("mountPath") == MOUNT_PATH for m in mounts):
                    continue
                container["volumeMounts"] = [*mounts, dict(mount)]
                needed = True
        if needed and existing is None:
            spec["volumes"] = [*volumes, token_volume(name)]

    @staticmethod
    def _validate_mirror(request: admission.Request, spec: Object) -> None:
        if spec.get("serviceAccountName"):
            raise admission.forbidden(request, "a mirror pod may not reference service accounts")
        if _secret_names(spec):
            raise admission.forbidden(request, "a mirror pod may not reference secrets")
        for volume in spec.get("volumes") or []:
            for source in ((volume or {}).get("projected") or {}).get("sources") or []:
                if (source or {}).get("serviceAccountToken") is not None:
                    raise admission.forbidden(
                        request, "a mirror pod may not use ServiceAccountToken volume projections"
                    )


def _secret_names(spec: Object) -> list[str]:
    names = [
        v["secret"].get("secretName", "")
        for v in spec.get("volumes") or []
        if isinstance(v, dict) and isinstance(v.get("secret"), dict)
    ]
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            for env in (container or {}).get("env") or []:
                ref = ((env or {}).get("valueFrom") or {}).get("secretKeyRef")
                if isinstance(ref, dict):
                    names.append(ref.get("name", ""))
    names += [s.get("name", "") for s in spec.get("imagePullSecrets") or [] if isinstance(s, dict)]
    return names


def _unmountable(account: Object, spec: Object) -> str:
    """limitSecretReferences: the first reference the account does not list, in upstream's words."""
    name = account["metadata"]["name"]
    mountable = {s.get("name") for s in account.get("secrets") or []}
    for volume in spec.get("volumes") or []:
        secret = (volume or {}).get("secret")
        if isinstance(secret, dict) and secret.get("secretName") not in mountable:
            return (
                f'volume with secret.secretName="{secret.get("secretName")}" is not allowed because service '
                f"account {name} does not reference that secret"
            )
    for field, label in (("initContainers", "init container"), ("containers", "container")):
        for container in spec.get(field) or []:
            for env in (container or {}).get("env") or []:
                ref = ((env or {}).get("valueFrom") or {}).get("secretKeyRef")
                if isinstance(ref, dict) and ref.get("name") not in mountable:
                    return (
                        f"{label} {container.get('name')} with envVar {env.get('name')} referencing "
                        f'secret.secretName="{ref.get("name")}" is not allowed because service account '
                        f"{name} does not reference that secret"
                    )
    pull = {s.get("name") for s in account.get("imagePullSecrets") or []}
    for index, ref in enumerate(spec.get("imagePullSecrets") or []):
        if (ref or {}).get("name") not in pull:
            return (
                f'imagePullSecrets[{index}].name="{ref.get("name")}" is not allowed because service account '
                f"{name} does not reference that imagePullSecret"
            )
    return ""
