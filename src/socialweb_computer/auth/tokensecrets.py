"""The two controllers that put identity material into namespaces, as kube-controller-manager does.

`TokenSecrets` is the legacy token controller: a Secret of type
`kubernetes.io/service-account-token` whose `kubernetes.io/service-account.name` annotation
names a ServiceAccount of its namespace gets `data.token` (a never-expiring token for that
account), `data.ca.crt` and `data.namespace`, and the account's UID in
`kubernetes.io/service-account.uid`. A Secret whose account does not exist (or has another
UID) is deleted, and deleting an account deletes its token Secrets: such a token must not
outlive what it names.

`RootCAPublisher` keeps a `kube-root-ca.crt` ConfigMap holding the cluster's serving CA in
every namespace that is not being deleted: created with the namespace, put back if deleted
or edited. Pods read it through their projected `kube-api-access-*` volume to verify the
apiserver.

Both react to after-write hooks and write in tasks with a fresh context (their writes are the
server's own). Owned and started by `apiserver.cluster.LogicalCluster`.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.auth import controllers, serviceaccounts

log = logging.getLogger(__name__)

Object = dict[str, Any]

TOKEN_SECRET_TYPE = "kubernetes.io/service-account-token"
ACCOUNT_NAME = "kubernetes.io/service-account.name"
ACCOUNT_UID = "kubernetes.io/service-account.uid"
MANAGER = "kube-controller-manager"
ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
ROOT_CA_KEY = "ca.crt"
ROOT_CA_DESCRIPTION = (
    "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints "
    "such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across "
    "distributions of Kubernetes clusters."
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _terminating(ns: Object) -> bool:
    meta, status = ns["metadata"], ns.get("status") or {}
    return bool(meta.get("deletionTimestamp")) or status.get("phase") == "Terminating"


class TokenSecrets:
    def __init__(self, store: Any, tokens: serviceaccounts.TokenService, root_ca_pem: bytes) -> None:
        self.store = store
        self.tokens = tokens
        self.root_ca_pem = root_ca_pem
        self.secrets = store.registry.lookup("", "v1", "secrets")
        self.accounts = store.registry.lookup("", "v1", "serviceaccounts")
        self._tasks = controllers.BackgroundTasks()

    async def start(self) -> None:
        only_tokens = store_mod.ListOptions(field_selector=f"type={TOKEN_SECRET_TYPE}")
        listed = await self.store.list(self.secrets, "", only_tokens)
        for secret in listed["items"]:
            await self.sync_secret(secret["metadata"]["namespace"], secret["metadata"]["name"])

    async def close(self) -> None:
        await self._tasks.close()

    def on_write(self, plural: str, event: str, new: Object | None, old: Object | None) -> None:
        if plural == "secrets" and new is not None and new.get("type") == TOKEN_SECRET_TYPE:
            if not new["metadata"].get("deletionTimestamp"):
                self._tasks.spawn(self.sync_secret(new["metadata"]["namespace"], new["metadata"]["name"]))
        elif plural == "serviceaccounts" and event == "DELETED" and old is not None:
            self._tasks.spawn(self.delete_tokens_of(old))

    async def sync_secret(self, namespace: str, name: str) -> None:
        try:
            secret = await self.store.get(self.secrets, namespace, name)
        except errors.StatusError:
            return
        annotations = secret["metadata"].get("annotations") or {}
        account_name = annotations.get(ACCOUNT_NAME, "")
        if not account_name or secret.get("type") != TOKEN_SECRET_TYPE:
            return
        account = await self._account(namespace, account_name)
        wanted_uid = annotations.get(ACCOUNT_UID, "")
        if account is None or (wanted_uid and wanted_uid != account["metadata"].get("uid")):
            await self._delete(secret)
            return
        data = dict(secret.get("data") or {})
        if data.get("token") and data.get(ROOT_CA_KEY) and data.get("namespace") and wanted_uid:
            return
        if not data.get("token"):
            data["token"] = _b64(self.tokens.issue_legacy(account, secret).encode())
        data.setdefault(ROOT_CA_KEY, _b64(self.root_ca_pem))
        data.setdefault("namespace", _b64(namespace.encode()))
        secret["data"] = data
        secret["metadata"]["annotations"] = {**annotations, ACCOUNT_UID: account["metadata"].get("uid", "")}
        try:
            await self.store.update(self.secrets, namespace, name, secret,
                                    store_mod.WriteOptions(field_manager=MANAGER))
        except errors.StatusError as e:
            # A conflict re-runs us through the hook of the write that won; a deletion ends it.
            log.debug("filling token secret %s/%s: %s", namespace, name, e.message)

    async def delete_tokens_of(self, account: Object) -> None:
        namespace = account["metadata"].get("namespace", "")
        listed = await self.store.list(self.secrets, namespace,
                                       store_mod.ListOptions(field_selector=f"type={TOKEN_SECRET_TYPE}"))
        for secret in listed["items"]:
            annotations = secret["metadata"].get("annotations") or {}
            uid = annotations.get(ACCOUNT_UID, "")
            if annotations.get(ACCOUNT_NAME) == account["metadata"]["name"] and (
                not uid or uid == account["metadata"].get("uid")
            ):
                await self._delete(secret)

    async def _account(self, namespace: str, name: str) -> Object | None:
        try:
            return await self.store.get(self.accounts, namespace, name)
        except errors.StatusError as e:
            if e.code == 404:
                return None
            raise

    async def _delete(self, secret: Object) -> None:
        meta = secret["metadata"]
        try:
            await self.store.delete(self.secrets, meta["namespace"], meta["name"],
                                    store_mod.DeleteOptions(precondition_uid=meta.get("uid")))
        except errors.StatusError as e:
            log.debug("deleting token secret %s/%s: %s", meta["namespace"], meta["name"], e.message)


class RootCAPublisher:
    def __init__(self, store: Any, root_ca_pem: bytes) -> None:
        self.store = store
        self.root_ca = root_ca_pem.decode()
        self.namespaces = store.registry.lookup("", "v1", "namespaces")
        self.configmaps = store.registry.lookup("", "v1", "configmaps")
        self._tasks = controllers.BackgroundTasks()

    async def start(self) -> None:
        listed = await self.store.list(self.namespaces, "", store_mod.ListOptions())
        for ns in listed["items"]:
            await self.ensure(ns["metadata"]["name"])

    async def close(self) -> None:
        await self._tasks.close()

    def on_write(self, plural: str, event: str, new: Object | None, old: Object | None) -> None:
        if plural == "namespaces" and event == "ADDED" and new is not None:
            self._tasks.spawn(self.ensure(new["metadata"]["name"]))
        elif plural == "configmaps":
            obj = new or old
            ours = obj is not None and obj["metadata"].get("name") == ROOT_CA_CONFIGMAP
            if ours and obj is not None and not self._current(new):
                self._tasks.spawn(self.ensure(obj["metadata"].get("namespace", "")))

    def _current(self, configmap: Object | None) -> bool:
        if configmap is None or configmap["metadata"].get("deletionTimestamp"):
            return False
        annotations = configmap["metadata"].get("annotations") or {}
        return ((configmap.get("data") or {}) == {ROOT_CA_KEY: self.root_ca}
                and annotations.get("kubernetes.io/description") == ROOT_CA_DESCRIPTION)

    def _wanted(self, namespace: str) -> Object:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": namespace,
                         "annotations": {"kubernetes.io/description": ROOT_CA_DESCRIPTION}},
            "data": {ROOT_CA_KEY: self.root_ca},
        }

    async def ensure(self, namespace: str) -> None:
        try:
            ns = await self.store.get(self.namespaces, "", namespace)
        except errors.StatusError:
            return
        if _terminating(ns):
            return
        options = store_mod.WriteOptions(field_manager=MANAGER)
        try:
            current = await self.store.get(self.configmaps, namespace, ROOT_CA_CONFIGMAP)
        except errors.StatusError as e:
            if e.code != 404:
                raise
            current = None
        try:
            if current is None:
                await self.store.create(self.configmaps, namespace, self._wanted(namespace), options)
            elif not self._current(current):
                wanted = self._wanted(namespace)
                meta = current["metadata"]
                meta["annotations"] = {**(meta.get("annotations") or {}), **wanted["metadata"]["annotations"]}
                current["data"] = wanted["data"]
                current.pop("binaryData", None)
                await self.store.update(self.configmaps, namespace, ROOT_CA_CONFIGMAP, current, options)
        except errors.StatusError as e:
            if e.reason not in ("AlreadyExists", "Conflict", "NotFound", "Forbidden"):
                log.warning("publishing %s in %s: %s", ROOT_CA_CONFIGMAP, namespace, e.message)
