"""The capacity controller: rents nodes when Pods need them, releases them when the work is gone.

One per gateway, serving every tenant. It is event-driven: each tenant's store write hook
wakes it for the writes that can change a decision (a pod created, bound, finished or
found unschedulable; a node added, gone or not Ready; a workload's replicas), and timers
wake it when a hold ends. A cluster where nothing changes costs nothing.

    tenant sync   lists the tenant's pods, nodes and workloads through its store and asks
                  intent.assess() what is work; plans the pending pods on new nodes
                  (plan.py) within the cluster's maximum; marks nodes idle; starts the
                  releases whose hold is over (drain.py)
    allocate      shares the host budget between the tenants that want nodes
                  (share.py), binds warm nodes, starts boots, refills the warm pool, and
                  says on each pending pod what came of it (wording.py)
    sweep         while nodes are rented, notices nodes that died (the bidder no longer
                  lists them) and removes them from their cluster so their pods are replaced

Nodes outlive the gateway: a restart re-adopts every node whose record names a cluster
that still exists, as Booting until its Node is Ready (so nothing is rented twice), reaps
what is left of nodes whose processes died, and stops nodes of clusters that are gone.
What it owns is what it rented (label `socialweb.computer/managed-by: capacity`); nodes an
operator started by hand are counted as room but never released.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.bidders import base as bidders
from socialweb_computer.capacity import drain, intent, plan, share, wording
from socialweb_computer.controllers import events, framework
from socialweb_computer.node import config as node_config
from socialweb_computer.storage import base as storage

log = logging.getLogger(__name__)

Object = dict[str, Any]
Report = Callable[[str, Object], Awaitable[None]]

BOOTING, READY, WARM, RELEASING, FAILED = "Booting", "Ready", "Warm", "Releasing", "Failed"
BLOCKED = "blocked"  # a pod that would get a node but for the bidder, a back-off or a full state directory
BOOT_RETRY_BASE = 5.0  # seconds before renting again after a failed boot, doubling
BOOT_RETRY_MAX = 300.0
ADOPTED_BOOT_DEADLINE = 180.0  # an adopted node not Ready by then is stopped
DRAIN_TIMEOUT = 120.0  # as cluster-autoscaler's max pod eviction time
# End-to-end tests shorten the drain deadline through this variable (not a spec field: operators keep
# upstream's).
DRAIN_TIMEOUT_ENV = "SOCIALWEB_CAPACITY_DRAIN_TIMEOUT"
# After a (re)start, the first allocation waits (at most this long) for every running cluster's
# control plane, so the first tenant to load cannot take the whole budget. (Generous: control
# planes load one after another after a restart, and a busy host is slow at it.)
STARTUP_GRACE = 30.0
# Boots at once: more than the host has cores only makes each slower (a boot is mostly CPU), past
# the bidder's deadline on a busy host; the rest wait their turn, counted as room on its way.
BOOT_CONCURRENCY = max(2, os.cpu_count() or 1)
BOOT_TIMEOUT = 180.0  # what a rented node may take to register (a busy host, a microVM under TCG)
SWEEP_INTERVAL = 5.0  # while nodes are rented: do they all still run?
STATE_DIR_MARGIN_MIB = 256
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
CONDITION = "Capacity"
DECISIONS_KEPT = 200

# What the tenant hook wakes a sync for (group, plural).
_WATCHED = {
    ("", "pods"),
    ("", "nodes"),
    ("batch", "jobs"),
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("scheduling.k8s.io", "priorityclasses"),
}
_LISTED = (
    ("pods", "", "pods"),
    ("jobs", "batch", "jobs"),
    ("deployments", "apps", "deployments"),
    ("statefulsets", "apps", "statefulsets"),
    ("daemonsets", "apps", "daemonsets"),
    ("priority_classes", "scheduling.k8s.io", "priorityclasses"),
)


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """One cluster's node settings: its Cluster's spec.nodes and spec.bidder over the defaults."""

    bidder: str
    size: node_config.Size
    release_after: float
    max_nodes: int


@dataclasses.dataclass(frozen=True)
class Settings:
    bidder: str = "none"
    priority_cutoff: int = intent.DEFAULT_CUTOFF
    budget_vcpu: int | None = None
    budget_mem_mib: int | None = None
    budget_disk_mib: int | None = None
    warm_nodes: int = 0
    warm_max: int = 0
    pool_size: node_config.Size = dataclasses.field(  # nodeDefaults' size
        default_factory=lambda: node_config.Size(2, 2048, 8192))
    pool_release_after: float = 120.0


@dataclasses.dataclass
class Rental:
    """A node capacity started (or adopted): bound to `cluster`, or warm in the pool ("")."""

    name: str
    cluster: str
    bidder: str
    size: node_config.Size
    state: str
    since: str
    reason: str
    image: str = ""
    started: float = 0.0  # loop time the rental began (boot duration)
    idle_since: float | None = None  # loop time it last had no work pod on it
    deadline: float = 0.0  # for adopted Booting nodes: stopped if not Ready by then
    pods: tuple[Object, ...] = ()  # the pending pods it was rented for

    @property
    def vcpu(self) -> int:
        return self.size.vcpu

    @property
    def mem_mib(self) -> int:
        return self.size.mem_mib


@dataclasses.dataclass(frozen=True)
class BudgetLine:
    resource: str
    unit: str
    used: float
    total: float


@dataclasses.dataclass(frozen=True)
class Decision:
    time: str
    cluster: str
    outcome: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Snapshot:
    budget: tuple[BudgetLine, ...]
    nodes: tuple[Rental, ...]
    warm_pool_target: int
    decisions: tuple[Decision, ...]
    bidder: str


@dataclasses.dataclass
class Tenant:
    name: str
    settings: ClusterSettings
    store: store_mod.Store | None = None
    url: str = ""
    recorder: events.Recorder | None = None
    priorities: intent.Priorities = dataclasses.field(default_factory=lambda: intent.Priorities({}))
    planned: plan.Plan | None = None
    shape: plan.Shape | None = None
    within_max: int = 0
    demand: int = 0
    fresh: bool = False  # planned since the last allocation (only a fresh plan is acted on)
    waiting: bool = False  # the last decision left pods without a node (max, budget, a blocker)
    blocker: str = ""  # why no node can be rented now (a NotTriggerScaleUp reason), "" if none
    blocker_detail: str = ""
    backoff_until: float = 0.0
    failures: int = 0
    idle_since: float | None = None
    intent_state: str = ""
    intent_reason: str = ""
    placeholders: tuple[Object, ...] = ()
    sent: dict[str, str] = dataclasses.field(default_factory=dict)  # pod uid → last message
    condition: tuple[str, str, str] = ("", "", "")
    hook: Callable[..., None] | None = None

    @property
    def attached(self) -> bool:
        return self.store is not None


def _now_text() -> str:
    return objects.rfc3339(objects.now())


def _key(obj: Object) -> str:
    return str(obj["metadata"].get("uid") or f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}")


def _pod_view(pod: Object | None) -> tuple[Any, ...]:
    """What a pod write must change for capacity to look again (not each container state)."""
    if pod is None:
        return ()
    spec, status, meta = pod.get("spec") or {}, pod.get("status") or {}, pod["metadata"]
    scheduled = next(
        (c.get("reason") for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None
    )
    return (
        spec.get("nodeName"),
        status.get("phase"),
        scheduled,
        bool(meta.get("deletionTimestamp")),
        status.get("nominatedNodeName"),
    )


def _node_view(node: Object | None) -> tuple[Any, ...]:
    if node is None:
        return ()
    ready = next(
        (
            c.get("status")
            for c in (node.get("status") or {}).get("conditions") or []
            if c.get("type") == "Ready"
        ),
        None,
    )
    not_ready = any(t.get("key") == NOT_READY_TAINT for t in (node.get("spec") or {}).get("taints") or [])
    return ready, bool((node.get("spec") or {}).get("unschedulable")), not_ready


def _settling(node: Object) -> bool:
    """A Node that registered but is not schedulable-Ready yet: not Ready, or still carrying the
    node lifecycle controller's not-ready taint (it goes a moment after Ready)."""
    ready, _, not_ready = _node_view(node)
    return ready != "True" or not_ready


class CapacityController:
    def __init__(
        self,
        state_dir: Path,
        settings: Settings,
        *,
        report: Report | None = None,
        bidder_factory: Callable[[str], bidders.Bidder] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.settings = settings
        self.report = report
        self.tenants: dict[str, Tenant] = {}
        self.rentals: dict[str, Rental] = {}
        self.total = share.Amount()
        self.warm_target = 0
        self.decisions: collections.deque[Decision] = collections.deque(maxlen=DECISIONS_KEPT)
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.queue = framework.WorkQueue(framework.Clock())
        # The gateway passes gateway.bidding's: bidders as its spec configures them (registries, image).
        self._bidder_factory = bidder_factory or _no_bidder
        self._bidders: dict[str, bidders.Bidder | str] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._worker: asyncio.Task[None] | None = None
        self._pool_excess_since: float | None = None
        self._starting_until = 0.0
        self._boots = asyncio.Semaphore(BOOT_CONCURRENCY)
        self._closed = False
        self.drain_timeout = _seconds_from_env(DRAIN_TIMEOUT_ENV, DRAIN_TIMEOUT)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, known_clusters: Iterable[str]) -> None:
        self.total = share.host_total(
            self.state_dir,
            self.settings.budget_vcpu,
            self.settings.budget_mem_mib,
            self.settings.budget_disk_mib,
        )
        await self._adopt(set(known_clusters))
        self._starting_until = self._loop_time() + STARTUP_GRACE
        self._worker = asyncio.get_running_loop().create_task(
            framework.run_worker("capacity-controller", self.queue, self._sync), name="capacity-controller"
        )
        self.queue.add(("allocate",))
        if self.rentals:
            self.queue.add_after(("sweep",), SWEEP_INTERVAL)

    async def close(self) -> None:
        """Stop deciding; boots in progress are cancelled (the bidder removes what they made),
        nodes that run are left running for the next gateway to adopt."""
        self._closed = True
        self.queue.shutdown()
        tasks = [t for t in (self._worker, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for tenant in self.tenants.values():
            self._unhook(tenant)

    def bidder(self, kind: str) -> bidders.Bidder | str:
        """The bidder of this kind, or why there is none."""
        if kind == "none" or not kind:
            return (
                "no bidder is configured: set capacity.bidder in the gateway spec (sandbox or qemu), "
                "or spec.bidder on the Cluster"
            )
        if kind not in self._bidders:
            try:
                bidder = self._bidder_factory(kind)
            except (bidders.BidderError, ImportError, ValueError) as exc:  # (a SpecError is a ValueError)
                self._bidders[kind] = f"the {kind} bidder is not available: {exc}"
            else:
                # A rented node may take longer than one started by hand: a busy host, TCG.
                if getattr(bidder, "start_timeout", BOOT_TIMEOUT) < BOOT_TIMEOUT:
                    bidder.start_timeout = BOOT_TIMEOUT  # type: ignore[attr-defined]
                self._bidders[kind] = bidder
        return self._bidders[kind]

    # ------------------------------------------------------------------ the gateway's hooks

    def configure(self, name: str, settings: ClusterSettings) -> None:
        """The Cluster's settings (called at every sync of a running Cluster)."""
        tenant = self.tenants.get(name)
        if tenant is None:
            self.tenants[name] = Tenant(name, settings)
            return
        if tenant.settings != settings:
            tenant.settings = settings
            tenant.failures, tenant.backoff_until = 0, 0.0  # a new size or bidder: try it at once
            self.queue.add(("tenant", name))

    def attach(self, name: str, store: store_mod.Store, url: str) -> None:
        """The tenant's control plane is loaded: watch it."""
        tenant = self.tenants.get(name)
        if tenant is None or self._closed:
            return
        self._unhook(tenant)
        tenant.store, tenant.url = store, url
        tenant.recorder = events.Recorder(store, framework.Clock())

        def hook(kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
            if (kind.group, kind.plural) not in _WATCHED:
                return
            if event == "MODIFIED" and kind.plural == "pods" and _pod_view(new) == _pod_view(old):
                return
            if event == "MODIFIED" and kind.plural == "nodes":
                if _node_view(new) == _node_view(old):
                    return
                if _node_view(new)[:1] != ("True",):
                    self.queue.add(("sweep",))
            self.queue.add(("tenant", name))

        tenant.hook = hook
        store.after_write.append(hook)
        self.queue.add(("tenant", name))

    async def detach(self, name: str, *, deleted: bool) -> None:
        """The cluster is parked (its rented nodes stop) or deleted (every node of it stops)."""
        tenant = self.tenants.pop(name, None)
        if tenant is not None:
            self._unhook(tenant)
        stops = [r for r in self.rentals.values() if r.cluster == name]
        for rental in stops:
            rental.state = RELEASING
        await asyncio.gather(
            *(self._stop(r, f"cluster {name} {'deleted' if deleted else 'parked'}") for r in stops)
        )
        if deleted:
            for kind in self._record_kinds():
                bidder = self.bidder(kind)
                if isinstance(bidder, str):
                    continue
                for handle in bidder.nodes():
                    if handle.cluster == name:
                        await bidder.stop(handle.name)
        self.queue.add(("allocate",))

    def _unhook(self, tenant: Tenant) -> None:
        if tenant.store is not None and tenant.hook is not None:
            with contextlib.suppress(ValueError):
                tenant.store.after_write.remove(tenant.hook)
        tenant.hook = None

    # ------------------------------------------------------------------ the work queue

    async def _sync(self, key: Hashable) -> None:
        what = key[0]  # type: ignore[index]
        if what == "tenant":
            await self._sync_tenant(key[1])  # type: ignore[index]
        elif what == "allocate":
            await self._allocate()
        elif what == "sweep":
            await self._sweep()

    def _loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ one tenant

    async def _observe(self, tenant: Tenant) -> tuple[intent.Observed, intent.Listed]:
        assert tenant.store is not None
        lists: dict[str, intent.Listed] = {}
        for field, group, plural in (*_LISTED, ("nodes", "", "nodes")):
            kind = tenant.store.registry.lookup(group, "v1", plural)
            if kind is None:
                lists[field] = intent.Listed(error=f"{plural}.{group or 'core'} is not served")
                continue
            try:
                listed = await tenant.store.list(kind, "", store_mod.ListOptions())
            except (errors.StatusError, storage.StorageError, OSError) as exc:
                lists[field] = intent.Listed(
                    error=getattr(exc, "message", None) or str(exc) or type(exc).__name__
                )
                continue
            lists[field] = intent.Listed(tuple(listed["items"]))
        nodes = lists.pop("nodes")
        return intent.Observed(**lists), nodes

    async def _sync_tenant(self, name: str) -> None:
        tenant = self.tenants.get(name)
        if tenant is None or not tenant.attached:
            return
        observed, nodes = await self._observe(tenant)
        result = intent.assess(observed, cutoff=self.settings.priority_cutoff)
        tenant.priorities = intent.Priorities.of(observed.priority_classes.items)
        tenant.intent_state, tenant.intent_reason = result.state, result.reason
        tenant.placeholders = result.placeholders
        now = self._loop_time()
        node_objects = {n["metadata"]["name"]: n for n in nodes.items}
        self._note_ready(tenant, node_objects, now)
        if result.state == intent.BUSY:
            tenant.idle_since = None
        elif result.state == intent.IDLE and tenant.idle_since is None:
            tenant.idle_since = now
        if result.known:  # (an unknown cluster says nothing of which nodes are idle)
            for rental in self._rentals_of(name, READY):
                if rental.name in result.busy_nodes:
                    rental.idle_since = None
                elif rental.idle_since is None:
                    rental.idle_since = now
        if result.known and not nodes.error:
            self._release_due(tenant, now)
        if observed.pods.error or nodes.error:
            tenant.demand, tenant.planned = 0, None
        else:
            self._plan(tenant, result, observed, nodes.items, now)
        self.queue.add(("allocate",))

    def _rentals_of(self, cluster: str, *states: str) -> list[Rental]:
        return [
            r for r in self.rentals.values() if r.cluster == cluster and (not states or r.state in states)
        ]

    def _note_ready(self, tenant: Tenant, node_objects: dict[str, Object], now: float) -> None:
        """Booting rentals whose Node is Ready are Ready; adopted ones past their deadline go."""
        for rental in self._rentals_of(tenant.name, BOOTING):
            node = node_objects.get(rental.name)
            if node is not None and _node_view(node)[:1] == ("True",) and rental.deadline:
                self._set_state(rental, READY, "adopted after a gateway restart")
                rental.idle_since = now
            elif rental.deadline and now > rental.deadline:
                rental.state = RELEASING
                self._spawn(
                    self._stop(rental, "did not become Ready after a gateway restart"), f"stop {rental.name}"
                )
            elif rental.deadline:
                self.queue.add_after(("tenant", tenant.name), rental.deadline - now)

    def _release_due(self, tenant: Tenant, now: float) -> None:
        hold = tenant.settings.release_after
        ready = sorted(self._rentals_of(tenant.name, READY), key=lambda r: (r.idle_since or 0.0, r.name))
        idle = [r for r in ready if r.idle_since is not None]
        staying = len(ready)
        for rental in idle:
            assert rental.idle_since is not None
            due = rental.idle_since + hold
            last = staying == 1
            if last:
                # The last node goes only once the whole cluster has had no work for the hold.
                if tenant.idle_since is None:
                    continue
                due = max(due, tenant.idle_since + hold)
            if now < due:
                self.queue.add_after(("tenant", tenant.name), due - now)
                continue
            staying -= 1
            self._set_state(rental, RELEASING, f"no work for {hold:.0f}s")
            self._spawn(self._release(tenant, rental), f"release {rental.name}")

    def _shape(self, tenant: Tenant) -> plan.Shape:
        """The template's labels: what every node capacity rents for the cluster carries (the
        image label is the bidder's own, per node, so a selector on it is not foreseen)."""
        labels = {bidders.LABEL_CLUSTER: tenant.name, bidders.LABEL_MANAGED: bidders.MANAGED_BY_CAPACITY}
        return plan.Shape(tenant.settings.bidder, tenant.settings.size, tuple(sorted(labels.items())))

    def _plan(
        self,
        tenant: Tenant,
        result: intent.Intent,
        observed: intent.Observed,
        nodes: tuple[Object, ...],
        now: float,
    ) -> None:
        settings = tenant.settings
        bidder = self.bidder(settings.bidder)
        tenant.shape = self._shape(tenant)
        pending = [p for p in result.pending if not (p.get("status") or {}).get("nominatedNodeName")]
        bound = [p for p in observed.pods.items if (p.get("spec") or {}).get("nodeName")]
        # A node of ours that registered but is not schedulable yet (the not-ready taint is still on
        # it) is room on its way, as a booting one: planned on the Node, the pods waiting for it
        # would not fit and a second node would be rented for them (as cluster-autoscaler counts
        # unready nodes as upcoming).
        ours = {r.name for r in self._rentals_of(tenant.name, READY)}
        settling = {n["metadata"]["name"] for n in nodes if n["metadata"]["name"] in ours and _settling(n)}
        booting = len(self._rentals_of(tenant.name, BOOTING)) + len(settling)
        tenant.planned = plan.plan(
            pending,
            tenant.shape,
            nodes=[n for n in nodes if n["metadata"]["name"] not in settling],
            bound=bound,
            booting=booting,
            daemonsets=observed.daemonsets.items,
        )
        counted = len(self._rentals_of(tenant.name, BOOTING, READY))
        tenant.within_max = max(0, settings.max_nodes - counted)
        tenant.blocker, tenant.blocker_detail = self._blocker(tenant, bidder, now)
        wanted = min(tenant.planned.new_nodes, tenant.within_max)
        tenant.demand = 0 if tenant.blocker else wanted
        tenant.fresh = True
        pending_uids = {_key(p) for p in pending}
        for uid in list(tenant.sent):
            if uid not in pending_uids:
                del tenant.sent[uid]

    def _blocker(self, tenant: Tenant, bidder: bidders.Bidder | str, now: float) -> tuple[str, str]:
        """Why no node can be rented for this cluster now: (NotTriggerScaleUp reason, detail)."""
        if isinstance(bidder, str):
            return (
                wording.NO_BIDDER
                if tenant.settings.bidder in ("", "none")
                else f"bidder {tenant.settings.bidder} unavailable"
            ), bidder
        missing = bidder.unavailable()
        if missing:
            return f"bidder {bidder.kind} unavailable", missing
        if now < tenant.backoff_until:
            return wording.BACKOFF, f"the last boot failed; retrying in {tenant.backoff_until - now:.0f}s"
        free = _free_mib(self.state_dir)
        needed = tenant.settings.size.rootfs_mib + STATE_DIR_MARGIN_MIB
        if free is not None and free < needed:
            return "state directory full", (
                f"the state directory {self.state_dir} has {free} MiB free and a node "
                f"needs {needed} MiB; free space there or shrink rootfsMiB"
            )
        return "", ""

    # ------------------------------------------------------------------ allocation

    async def _allocate(self) -> None:
        now = self._loop_time()
        if now < self._starting_until and any(not t.attached for t in self.tenants.values()):
            self.queue.add_after(("allocate",), 0.1)
            return
        held: dict[str, share.Amount] = collections.defaultdict(share.Amount)
        used = share.Amount()
        for rental in self.rentals.values():
            used += share.Amount.of(rental.size)
            held[rental.cluster] += share.Amount.of(rental.size)
        free = self.total - used
        wanting = [
            t
            for t in sorted(self.tenants.values(), key=lambda t: t.name)
            if t.attached and t.planned is not None and t.fresh
        ]
        from_pool = {t.name: self._take_warm(t) for t in wanting if t.demand > 0}
        demands = [
            share.Demand(t.name, t.demand - from_pool.get(t.name, 0), share.Amount.of(t.settings.size))
            for t in wanting
            if t.demand - from_pool.get(t.name, 0) > 0
        ]
        granted = share.share(free, self.total, held, demands)
        for tenant in wanting:
            cold = granted.get(tenant.name, 0)
            free -= share.Amount.of(tenant.settings.size).times(cold)
            await self._decide(tenant, from_pool.get(tenant.name, 0), cold)
        self._tend_pool(free, now)
        for tenant in self.tenants.values():
            if tenant.attached:
                await self._report(tenant)

    async def _decide(self, tenant: Tenant, warm: int, cold: int) -> None:
        assert tenant.planned is not None and tenant.shape is not None and tenant.recorder is not None
        planned = tenant.planned
        granted = warm + cold
        tenant.fresh = False  # acted on: the next allocation waits for the next look at the tenant
        current = len(self._rentals_of(tenant.name, BOOTING, READY)) - warm  # (warm ones are Booting already)
        verdicts = plan.verdicts(
            planned, within_max=min(planned.new_nodes, tenant.within_max), granted=granted
        )
        if tenant.blocker:  # nothing could be rented whatever the limits: say why
            verdicts = [
                plan.Verdict(v.pod, BLOCKED) if v.outcome in (plan.BUDGET, plan.MAX_NODES) else v
                for v in verdicts
            ]
        bins: dict[int, list[Object]] = collections.defaultdict(list)
        for placed in planned.placed:
            if placed.where == plan.TRIGGERED and placed.node < granted:
                bins[placed.node].append(placed.pod)
        for index in range(cold):
            self._rent(tenant, tuple(bins.get(warm + index, ())))
        maximum = tenant.settings.max_nodes
        for verdict in verdicts:
            await self._tell(tenant, verdict, current, granted, maximum)
        if granted:
            what = f"{granted} node(s) of {tenant.shape.group}" + (
                f" ({warm} from the warm pool)" if warm else ""
            )
            self._decided(
                tenant.name,
                "warm" if warm and not cold else "rented",
                f"{what} for {planned.on_new_nodes()} pending pod(s)",
            )
        refused = [v for v in verdicts if v.outcome in (plan.MAX_NODES, plan.BUDGET, plan.NO_FIT, BLOCKED)]
        tenant.waiting = any(v.outcome in (plan.BUDGET, BLOCKED) for v in verdicts)
        if refused and not granted:
            self._decided(tenant.name, "refused", self._refusal(tenant, refused), once=True)

    def _refusal(self, tenant: Tenant, refused: list[plan.Verdict]) -> str:
        reasons = collections.Counter(
            {
                plan.MAX_NODES: wording.MAX_NODES_REACHED,
                plan.BUDGET: wording.HOST_BUDGET,
                BLOCKED: tenant.blocker,
                plan.NO_FIT: "pod too large for the node size",
            }.get(v.outcome, v.outcome)
            for v in refused
        )
        return ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))

    async def _tell(
        self, tenant: Tenant, verdict: plan.Verdict, current: int, granted: int, maximum: int
    ) -> None:
        """The event a pending pod gets for this decision, once per change of what it says."""
        assert tenant.recorder is not None and tenant.shape is not None
        outcome, message = verdict.outcome, ""
        if outcome == BLOCKED:
            message = wording.no_scale_up([tenant.blocker])
        elif outcome == plan.TRIGGERED:
            message = wording.scale_up(tenant.shape.group, current, current + granted, maximum)
        elif outcome == plan.NO_FIT:
            message = wording.would_not_fit(verdict.reasons)
        elif outcome == plan.MAX_NODES:
            message = wording.no_scale_up([wording.MAX_NODES_REACHED])
        elif outcome == plan.BUDGET:
            message = wording.no_scale_up([wording.HOST_BUDGET])
        uid = _key(verdict.pod)
        if not message:
            tenant.sent[uid] = outcome
            return
        if tenant.sent.get(uid) == message or (
            outcome == plan.TRIGGERED and tenant.sent.get(uid) == plan.UPCOMING
        ):
            return
        tenant.sent[uid] = message
        reason = (
            wording.TRIGGERED_SCALE_UP
            if message.startswith("pod triggered")
            else wording.NOT_TRIGGER_SCALE_UP
        )
        await tenant.recorder.event(wording.COMPONENT, verdict.pod, events.NORMAL, reason, message)

    def _decided(self, cluster: str, outcome: str, reason: str, *, once: bool = False) -> None:
        if (
            once
            and self.decisions
            and (self.decisions[-1].cluster, self.decisions[-1].outcome, self.decisions[-1].reason)
            == (cluster, outcome, reason)
        ):
            return
        self.outcomes[outcome] += 1
        self.decisions.append(Decision(_now_text(), cluster, outcome, reason))
        log.info("capacity: %s: %s %s", cluster or "warm pool", outcome, reason)

    # ------------------------------------------------------------------ renting

    def _set_state(self, rental: Rental, state: str, reason: str) -> None:
        rental.state, rental.reason, rental.since = state, reason, _now_text()

    def _rent(self, tenant: Tenant, pods: tuple[Object, ...]) -> None:
        bidder = self.bidder(tenant.settings.bidder)
        assert not isinstance(bidder, str)
        name = bidders.new_node_name(bidder.kind)
        first = pods[0]["metadata"] if pods else {}
        reason = f"for pod {first.get('namespace')}/{first.get('name')}" if pods else "for pending pods"
        rental = Rental(
            name,
            tenant.name,
            bidder.kind,
            tenant.settings.size,
            BOOTING,
            _now_text(),
            reason,
            started=self._loop_time(),
            pods=pods,
        )
        self.rentals[name] = rental
        log.info("capacity: renting node %s for %s (%s)", name, tenant.name, reason)
        self._spawn(self._boot(tenant, bidder, rental), f"boot {name}")

    async def _boot(self, tenant: Tenant, bidder: bidders.Bidder, rental: Rental) -> None:
        labels = {bidders.LABEL_MANAGED: bidders.MANAGED_BY_CAPACITY}
        request = bidders.NodeRequest(
            cluster=tenant.name, server=tenant.url, size=rental.size, labels=labels, name=rental.name
        )
        try:
            async with self._boots:
                handle = await bidder.start(request)
        except asyncio.CancelledError:
            self.rentals.pop(rental.name, None)
            raise
        except Exception as exc:  # a BidderError says why; anything else is a bug, said as well
            self.rentals.pop(rental.name, None)
            await self._boot_failed(tenant, rental, exc)
            return
        rental.image = handle.image
        self._booted(tenant, rental)

    def _booted(self, tenant: Tenant, rental: Rental) -> None:
        now = self._loop_time()
        tenant.failures, tenant.backoff_until = 0, 0.0
        if rental.name in self.rentals:
            self._set_state(rental, READY, rental.reason)
            rental.idle_since = now
        self.queue.add(("tenant", tenant.name))
        self.queue.add_after(("sweep",), SWEEP_INTERVAL)

    async def _boot_failed(self, tenant: Tenant, rental: Rental, exc: BaseException) -> None:
        message = str(exc) if isinstance(exc, bidders.BidderError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, bidders.BidderError):
            log.error("capacity: booting %s for %s failed", rental.name, tenant.name, exc_info=exc)
        tenant.failures += 1
        delay = min(BOOT_RETRY_BASE * 2 ** (tenant.failures - 1), BOOT_RETRY_MAX)
        tenant.backoff_until = self._loop_time() + delay
        group = tenant.shape.group if tenant.shape else rental.bidder
        self._decided(tenant.name, "failed", f"{rental.name}: {message}")
        log.warning(
            "capacity: %s: node %s failed to boot (retry in %.0fs): %s",
            tenant.name,
            rental.name,
            delay,
            message,
        )
        if tenant.recorder is not None:
            for pod in rental.pods:
                await tenant.recorder.event(
                    wording.COMPONENT,
                    pod,
                    events.WARNING,
                    wording.FAILED_TO_SCALE_UP,
                    wording.failed_scale_up(group, message, delay),
                )
        if "No space left" in message or "no space left" in message:
            tenant.blocker_detail = message
        self.queue.add(("tenant", tenant.name))
        self.queue.add_after(("tenant", tenant.name), delay)

    # ------------------------------------------------------------------ the warm pool

    def _warm_bidder(self) -> Any:
        bidder = self.bidder(self.settings.bidder)
        if isinstance(bidder, str) or not hasattr(bidder, "start_warm") or not hasattr(bidder, "bind"):
            return None
        return bidder

    def _take_warm(self, tenant: Tenant) -> int:
        """Bind warm nodes of the tenant's shape to it, up to its demand; how many."""
        if tenant.settings.bidder != self.settings.bidder or tenant.settings.size != self.settings.pool_size:
            return 0
        bidder = self._warm_bidder()
        if bidder is None:
            return 0
        warm = [r for r in self.rentals.values() if r.cluster == "" and r.state == WARM]
        taken = warm[: tenant.demand]
        for rental in taken:
            rental.cluster = tenant.name
            self._set_state(rental, BOOTING, "from the warm pool")
            rental.started, rental.deadline = self._loop_time(), 0.0
            self._spawn(self._bind(tenant, bidder, rental), f"bind {rental.name}")
        return len(taken)

    async def _bind(self, tenant: Tenant, bidder: Any, rental: Rental) -> None:
        labels = {bidders.LABEL_MANAGED: bidders.MANAGED_BY_CAPACITY}
        request = bidders.NodeRequest(
            cluster=tenant.name, server=tenant.url, size=rental.size, labels=labels, name=rental.name
        )
        try:
            await bidder.bind(rental.name, request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("capacity: binding warm node %s to %s failed: %s", rental.name, tenant.name, exc)
            rental.state = RELEASING
            await self._stop(rental, f"bind failed: {exc}")
            self.queue.add(("tenant", tenant.name))
            return
        self._booted(tenant, rental)

    def pool_demand(self) -> int:
        """How many pool-sized nodes the pause pods of clusters with the pool's shape would fill."""
        demand = 0
        for tenant in self.tenants.values():
            if (
                tenant.placeholders
                and tenant.shape is not None
                and tenant.settings.bidder == self.settings.bidder
                and tenant.settings.size == self.settings.pool_size
            ):
                demand += plan.nodes_for(tenant.placeholders, tenant.shape)
        return demand

    def _tend_pool(self, free: share.Amount, now: float) -> None:
        bidder = self._warm_bidder()
        target = 0
        if bidder is not None:
            target = min(self.settings.warm_max, self.settings.warm_nodes + self.pool_demand())
        self.warm_target = target
        pool = [r for r in self.rentals.values() if r.cluster == ""]
        if len(pool) > target:
            if self._pool_excess_since is None:
                self._pool_excess_since = now
            due = self._pool_excess_since + self.settings.pool_release_after
            if now < due and bidder is not None:
                self.queue.add_after(("allocate",), due - now)
                return
            for rental in [r for r in pool if r.state == WARM][: len(pool) - target]:
                rental.state = RELEASING
                self._spawn(
                    self._stop(rental, "the warm pool is larger than its target"), f"stop {rental.name}"
                )
            return
        self._pool_excess_since = None
        size = share.Amount.of(self.settings.pool_size)
        for _ in range(target - len(pool)):
            if not size.fits_in(free) or bidder.unavailable():
                break
            free -= size
            name = bidders.new_node_name(bidder.kind)
            rental = Rental(
                name,
                "",
                bidder.kind,
                self.settings.pool_size,
                BOOTING,
                _now_text(),
                "warm pool",
                started=now,
            )
            self.rentals[name] = rental
            log.info("capacity: booting node %s for the warm pool", name)
            self._spawn(self._boot_warm(bidder, rental), f"warm {name}")

    async def _boot_warm(self, bidder: Any, rental: Rental) -> None:
        labels = {bidders.LABEL_MANAGED: bidders.MANAGED_BY_CAPACITY}
        try:
            async with self._boots:
                handle = await bidder.start_warm(rental.size, labels, name=rental.name)
        except asyncio.CancelledError:
            self.rentals.pop(rental.name, None)
            raise
        except Exception as exc:
            self.rentals.pop(rental.name, None)
            self._decided("", "failed", f"warm node {rental.name}: {exc}")
            log.warning("capacity: warm node %s failed to boot: %s", rental.name, exc)
            return
        rental.image = handle.image
        self._set_state(rental, WARM, "warm pool")
        self._decided("", "warm", f"{rental.name} is warm")
        self.queue.add(("allocate",))
        self.queue.add_after(("sweep",), SWEEP_INTERVAL)

    # ------------------------------------------------------------------ releasing

    async def _release(self, tenant: Tenant, rental: Rental) -> None:
        store, recorder = tenant.store, tenant.recorder
        assert store is not None and recorder is not None
        try:
            if not await self._drain(tenant, rental):
                self._set_state(rental, READY, "drain aborted")
                rental.idle_since = self._loop_time()
                return
            await self._stop(rental, rental.reason)
            await drain.forget(
                store, recorder, rental.name, reason=wording.SCALE_DOWN, message=wording.REMOVED
            )
            self._decided(tenant.name, "released", f"{rental.name}: {rental.reason}")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("capacity: releasing %s of %s failed", rental.name, tenant.name)
            if rental.name in self.rentals:
                self._set_state(rental, READY, "release failed")
                rental.idle_since = self._loop_time()
        finally:
            self.queue.add(("tenant", tenant.name))

    async def _drain(self, tenant: Tenant, rental: Rental) -> bool:
        store, recorder = tenant.store, tenant.recorder
        assert store is not None and recorder is not None
        node = await drain.cordon(store, recorder, rental.name)
        if node is None:
            return True  # no Node: nothing runs there for the cluster
        # A pod may have been bound between the decision and the cordon: then the node stays.
        for pod in await drain.pods_on(store, rental.name):
            if intent.is_work("pods", pod, tenant.priorities, self.settings.priority_cutoff)[0]:
                await drain.uncordon(store, rental.name)
                return False
        why = await drain.drain(store, recorder, rental.name, timeout=self.drain_timeout)
        if why:
            await drain.abort(store, recorder, rental.name, why)
            return False
        return True

    async def _stop(self, rental: Rental, reason: str) -> None:
        bidder = self.bidder(rental.bidder)
        try:
            if not isinstance(bidder, str):
                await bidder.stop(rental.name)
        finally:
            self.rentals.pop(rental.name, None)
            log.info("capacity: node %s stopped (%s)", rental.name, reason)
            # Budget was freed: clusters that waited for it look again.
            for tenant in self.tenants.values():
                if tenant.waiting:
                    self.queue.add(("tenant", tenant.name))
            self.queue.add(("allocate",))

    # ------------------------------------------------------------------ dead nodes

    async def _sweep(self) -> None:
        by_kind: dict[str, set[str]] = {}
        for kind in {r.bidder for r in self.rentals.values()}:
            bidder = self.bidder(kind)
            if not isinstance(bidder, str):
                by_kind[kind] = {h.name for h in bidder.nodes()}
        for rental in list(self.rentals.values()):
            alive = by_kind.get(rental.bidder)
            if alive is None or rental.name in alive or rental.state not in (READY, WARM):
                continue
            await self._died(rental)
        if self.rentals:
            self.queue.add_after(("sweep",), SWEEP_INTERVAL)

    async def _died(self, rental: Rental) -> None:
        log.warning(
            "capacity: node %s of %s is gone; removing it", rental.name, rental.cluster or "the warm pool"
        )
        rental.state = RELEASING
        await self._stop(rental, "it died")
        tenant = self.tenants.get(rental.cluster)
        if tenant is None or tenant.store is None or tenant.recorder is None:
            return
        await drain.forget(
            tenant.store,
            tenant.recorder,
            rental.name,
            reason=wording.DELETING_NODE,
            message=f"Deleting node {rental.name} because it does not exist in the {rental.bidder} bidder",
            pod_message="PodGC: node no longer exists",
        )
        self._decided(rental.cluster, "failed", f"{rental.name} died; its pods are replaced")
        self.queue.add(("tenant", rental.cluster))

    # ------------------------------------------------------------------ adoption

    def _record_kinds(self) -> list[str]:
        """Every bidder whose nodes may be on this host (a spec may have changed bidder since)."""
        wanted = (t.settings.bidder for t in self.tenants.values())
        kinds_ = {"sandbox", "qemu", self.settings.bidder, *wanted}
        return sorted(k for k in kinds_ if k and k != "none")

    async def _adopt(self, known: set[str]) -> None:
        now = self._loop_time()
        for kind in self._record_kinds():
            bidder = self.bidder(kind)
            if isinstance(bidder, str):
                continue
            reap = getattr(bidder, "reap", None)
            if reap is not None:
                for name in await reap():
                    log.info("capacity: reaped what was left of node %s (its processes were gone)", name)
            for handle in bidder.nodes():
                managed = handle.labels.get(bidders.LABEL_MANAGED) == bidders.MANAGED_BY_CAPACITY
                if handle.cluster and handle.cluster not in known:
                    log.info(
                        "capacity: stopping node %s: its cluster %s is gone", handle.name, handle.cluster
                    )
                    await bidder.stop(handle.name)
                    continue
                if not managed:
                    continue
                state = WARM if not handle.cluster else BOOTING
                self.rentals[handle.name] = Rental(
                    handle.name,
                    handle.cluster,
                    kind,
                    handle.size,
                    state,
                    _now_text(),
                    "adopted after a restart",
                    image=handle.image,
                    started=now,
                    deadline=now + ADOPTED_BOOT_DEADLINE,
                )
                log.info("capacity: adopted node %s of %s", handle.name, handle.cluster or "the warm pool")

    # ------------------------------------------------------------------ conditions

    async def _report(self, tenant: Tenant) -> None:
        condition = self._condition(tenant)
        if condition == tenant.condition or self.report is None:
            return
        tenant.condition = condition
        status, reason, message = condition
        try:
            await self.report(
                tenant.name, {"type": CONDITION, "status": status, "reason": reason, "message": message}
            )
        except errors.StatusError as exc:
            tenant.condition = ("", "", "")
            log.debug("capacity: condition of %s not written: %s", tenant.name, exc.message)

    def _condition(self, tenant: Tenant) -> tuple[str, str, str]:
        nodes = self._rentals_of(tenant.name, BOOTING, READY)
        booting = [r for r in nodes if r.state == BOOTING]
        group = tenant.shape.group if tenant.shape else tenant.settings.bidder
        if tenant.intent_state == intent.UNKNOWN:
            return (
                "Unknown",
                "ListFailed",
                f"{tenant.intent_reason}; no node is released until the lists work again",
            )
        planned = tenant.planned
        wanting = planned is not None and any(p.where == plan.TRIGGERED for p in planned.placed)
        if tenant.blocker and wanting:
            reason = {
                wording.NO_BIDDER: "NoBidder",
                wording.BACKOFF: "BootFailed",
                "state directory full": "StateDirectoryFull",
            }.get(tenant.blocker, "BidderUnavailable")
            return "False", reason, tenant.blocker_detail
        if (planned is not None and wanting and tenant.demand < planned.new_nodes
                and tenant.within_max < planned.new_nodes):
            return (
                "False",
                "MaxNodesReached",
                f"pending pods need {planned.new_nodes} more node(s) of {group}; spec.nodes.max is "
                f"{tenant.settings.max_nodes}",
            )
        if planned is not None and wanting and tenant.demand and not booting:
            size = share.Amount.of(tenant.settings.size)
            used = sum((share.Amount.of(r.size) for r in self.rentals.values()), share.Amount())
            return (
                "False",
                "HostBudgetExhausted",
                f"pending pods need {tenant.demand} node(s) of {group}; the host budget has no room: "
                f"{share.describe_shortage(size, self.total - used, self.total)}",
            )
        if planned is not None and any(p.where == plan.NO_FIT for p in planned.placed):
            count = sum(1 for p in planned.placed if p.where == plan.NO_FIT)
            return ("False", "PodsDoNotFit", f"{count} pending pod(s) would not fit on a new node of {group}")
        if booting:
            return "True", "ScalingUp", f"{len(booting)} node(s) of {group} booting"
        if tenant.intent_state == intent.BUSY:
            return "True", "Busy", f"{tenant.intent_reason}; {len(nodes)} rented node(s)"
        if nodes:
            return (
                "True",
                "Idle",
                f"no work; the {len(nodes)} rented node(s) are released "
                f"{tenant.settings.release_after:.0f}s after the work ended",
            )
        return "True", "ScaledToZero", "no work and no rented node"

    # ------------------------------------------------------------------ what it shows (capacityview)

    def snapshot(self) -> Snapshot:
        used = sum((share.Amount.of(r.size) for r in self.rentals.values()), share.Amount())
        budget = tuple(
            BudgetLine(name, unit, float(getattr(used, name)), float(getattr(self.total, name)))
            for name, unit in share.RESOURCES
        )
        nodes = tuple(
            dataclasses.replace(r, pods=())
            for r in sorted(self.rentals.values(), key=lambda r: (r.cluster, r.name))
        )
        return Snapshot(budget, nodes, self.warm_target, tuple(self.decisions), self.settings.bidder)

    def collect(self) -> Iterator[Metric]:
        decisions = CounterMetricFamily(
            "socialweb_rental_decisions", "What capacity decided about pending work.", labels=("outcome",)
        )
        for outcome in ("rented", "warm", "refused", "released", "failed"):
            decisions.add_metric((outcome,), self.outcomes.get(outcome, 0))
        yield decisions


def _seconds_from_env(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


def _free_mib(path: Path) -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize >> 20


def _no_bidder(kind: str) -> bidders.Bidder:
    raise bidders.BidderError("this capacity controller was given no way to make bidders")
