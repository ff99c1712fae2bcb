"""A logical cluster: a key prefix in the shared store, its registry of kinds, its store
and the controllers that must run for its API to behave (CRD establishment).

It is not a process and owns no socket: listeners (see `app.py`) serve it. That is
what lets an idle tenant cost almost nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import (
    admission,
    crds,
    defaultclass,
    fairness,
    metrics,
    namespaces,
    registry,
    store,
    streaming,
    webhooks,
)
from socialweb_computer.apiserver.admission import (
    lifecycle,
    limitranger,
    podsecurity,
    priority,
    resourcequota,
    serviceaccount,
)
from socialweb_computer.apiserver.streaming import logs as streaming_logs
from socialweb_computer.apiserver.streaming import proxy as streaming_proxy
from socialweb_computer.apiserver.streaming import remote as streaming_remote
from socialweb_computer.auth import certificates, pki, policy, serviceaccounts, tokens, tokensecrets
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

SubresourceHandler = Callable[..., Awaitable[Any]]


class LogicalCluster:
    """`keys` sign its ServiceAccount tokens (in memory when None); `root_ca_pem` is the CA its
    listener's certificate chains to, published to pods as `kube-root-ca.crt` (none: not published);
    `client_ca` is the (certificate, key) file pair of the ClientCA its listener trusts: with it,
    approved kubernetes.io/kube-apiserver-client CSRs are signed."""

    def __init__(self, name: str, backend: storage.Backend, *, keys: tokens.KeySet | None = None,
                 root_ca_pem: bytes = b"", client_ca: tuple[str, str] | None = None,
                 limits: fairness.Limits | None = None,
                 on_problems_changed: Callable[[], None] | None = None,
                 pod_security: podsecurity.Config | None = None) -> None:
        from socialweb_computer.apiserver import subresources

        self.name = name
        self.backend = backend
        self.registry = registry.Registry()
        self.store = store.Store(name, backend, self.registry)
        self.metrics = metrics.ApiserverMetrics()
        # What this cluster may take of the process (unlimited unless the gateway says otherwise).
        self.budget = fairness.Budget(limits)
        self.store.budget = self.budget
        self.budget.set_counter(self._count_objects)
        self.store.after_write.append(self._count_writes)
        self.crds = crds.CrdController(self.store)
        self.auth = policy.ClusterPolicy(self.store, on_problems_changed)
        self.tokens = serviceaccounts.TokenService(self.store, keys or tokens.KeySet(None))
        self.token_secrets = tokensecrets.TokenSecrets(self.store, self.tokens, root_ca_pem)
        self.root_ca = tokensecrets.RootCAPublisher(self.store, root_ca_pem) if root_ca_pem else None
        self.store.after_write.append(self._identity_writes)
        self.certificates = certificates.CsrAdmission(self.store, self.auth)
        self.priority = priority.PriorityAdmission(self.store)
        self.default_classes = defaultclass.DefaultClassAdmission(self.store)
        self.webhooks = webhooks.WebhookAdmission(self.store)
        self.store.webhooks = self.webhooks
        self.limit_ranger = limitranger.LimitRanger(self.store)
        self.quota = resourcequota.ResourceQuota(self.store)
        self.pod_security = podsecurity.PodSecurity(self.store, pod_security or podsecurity.Config(),
                                                    policy.current_username)
        # kube-apiserver's default order; Priority runs as a before-write hook between the two phases.
        self.store.admission = admission.Chain([
            lifecycle.NamespaceLifecycle(self.store),
            self.limit_ranger,
            serviceaccount.ServiceAccountAdmission(self.store),
            self.pod_security,
            self.quota,
        ])
        self.namespaces = namespaces.NamespaceController(self.store)
        from socialweb_computer.controllers import manager as controllers

        signer = pki.FileSigner(*client_ca) if client_ca is not None else None
        self.controllers = controllers.Manager(self.store, signer=signer,
                                               on_problems_changed=on_problems_changed)
        self.subresource_handlers: dict[str, SubresourceHandler] = dict(subresources.HANDLERS)
        # How pods' streaming subresources reach node agents; set by the gateway (None: no nodes).
        self.node_dialer: streaming.NodeDialer | None = None
        self.subresource_handlers["log"] = streaming_logs.handler(lambda c: c.node_dialer)
        for sub in streaming_remote.STREAMING:
            self.subresource_handlers[sub] = streaming_remote.handler(lambda c: c.node_dialer)
        self.subresource_handlers["proxy"] = streaming_proxy.handler()
        self._openapi: dict[str, tuple[int, Any]] = {}

    async def start(self) -> None:
        await self.budget.load()
        await self.crds.start()
        await self.auth.start()
        await self.priority.start()
        await self.default_classes.start()
        await self.webhooks.start()
        await self.limit_ranger.start()
        await self._ensure_namespaces()
        await self.namespaces.start()
        await self.token_secrets.start()
        if self.root_ca is not None:
            await self.root_ca.start()
        await self.controllers.start()
        await self.quota.start()

    async def close(self) -> None:
        await self.quota.close()
        await self.auth.close()
        await self.token_secrets.close()
        if self.root_ca is not None:
            await self.root_ca.close()
        await self.controllers.close()
        await self.namespaces.close()
        await self.crds.close()
        await self.webhooks.close()

    async def _ensure_namespaces(self) -> None:
        ns_kind = self.registry.lookup("", "v1", "namespaces")
        assert ns_kind is not None
        for name in SYSTEM_NAMESPACES:
            if await self.store.backend.get(self.store.key(ns_kind, "", name)) is not None:
                continue  # a restart: the create below would go the whole write path to fail
            try:
                await self.store.create(ns_kind, "", {"metadata": {"name": name}},
                                        store.WriteOptions(field_manager="kube-apiserver"))
            except errors.StatusError as e:
                if e.reason != "AlreadyExists":
                    raise

    def problems(self) -> list[str]:
        """What this cluster serves wrong or not at all (readiness, the Cluster's status)."""
        return self.auth.problems() + storage.problems_of(self.backend)

    def _count_writes(self, kind: Any, event: str, new: Any, old: Any) -> None:
        self.budget.on_write(kind.group, kind.plural, event)

    async def _count_objects(self) -> tuple[int, int]:
        """(objects, pods) stored under this cluster, Events left out (fairness.Budget counts so)."""
        prefix = f"/{self.name}/"
        total = await self.backend.count(prefix)
        uncounted = 0
        for group, plural in (("core", "events"), ("events.k8s.io", "events")):
            uncounted += await self.backend.count(f"{prefix}{group}/{plural}/")
        pods = await self.backend.count(f"{prefix}core/pods/")
        return total - uncounted, pods

    def _identity_writes(self, kind: Any, event: str, new: Any, old: Any) -> None:
        if kind.group == "":
            self.token_secrets.on_write(kind.plural, event, new, old)
            if self.root_ca is not None:
                self.root_ca.on_write(kind.plural, event, new, old)

    def openapi_cache(self, key: str, build: Callable[[], Any]) -> Any:
        """OpenAPI documents are rebuilt only when the set of kinds changes."""
        cached = self._openapi.get(key)
        if cached is not None and cached[0] == self.registry.generation:
            return cached[1]
        value = build()
        self._openapi[key] = (self.registry.generation, value)
        return value
