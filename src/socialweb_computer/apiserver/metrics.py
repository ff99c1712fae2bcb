"""What one logical cluster's `/metrics` serves: kube-apiserver's request and storage metrics.

Names, labels and buckets are upstream's (k8s.io/apiserver endpoints/metrics), so
dashboards and alerts written for kube-apiserver work on a tenant as they are:

    apiserver_request_total               counter    verb dry_run group version resource
                                                     subresource scope component code
    apiserver_request_duration_seconds    histogram  the same labels but code
    apiserver_current_inflight_requests   gauge      request_kind (readOnly, mutating)
    apiserver_longrunning_requests        gauge      verb group version resource subresource
                                                     scope component (open watches and streams)
    apiserver_storage_objects             gauge      resource ("pods", "deployments.apps")

Why not prometheus_client's Counter and Histogram objects: a gateway holds a thousand
tenants, and a labelled Histogram child costs a lock and an object per bucket. Here the
counts are plain dicts keyed by label tuples (an idle tenant holds four empty ones) and
`collect()` hands them to prometheus_client as metric families at scrape time, which
writes the exposition format. Label values are bounded: a resource the cluster does not
serve is reported with empty group/version/resource, never as the path the client sent.
Called by the `metrics_middleware` of `app.py` and by the `/metrics` handler.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from socialweb_computer.apiserver import registry as registry_mod
from socialweb_computer.apiserver import requests as req

# kube-apiserver's buckets for apiserver_request_duration_seconds.
DURATION_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0,
                    8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
REQUEST_LABELS = ("verb", "dry_run", "group", "version", "resource", "subresource", "scope", "component")
LONGRUNNING_LABELS = ("verb", "group", "version", "resource", "subresource", "scope", "component")
COMPONENT = "apiserver"
# What kube-apiserver answers; every name here is a classic one, so any Prometheus reads it.
CONTENT_TYPE = exposition.CONTENT_TYPE_PLAIN_0_0_4
# Subresources whose requests stream for as long as the client stays (upstream's long-running check).
_STREAMING_SUBRESOURCES = frozenset(("attach", "exec", "portforward", "proxy", "log"))
_CONNECT_SUBRESOURCES = frozenset(("attach", "exec", "portforward", "proxy"))
_MUTATING = frozenset(("POST", "PUT", "PATCH", "DELETE"))

Labels = tuple[str, str, str, str, str, str, str, str]


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """A request in the metrics' terms: its label values and how it is counted."""

    labels: Labels
    long_running: bool
    mutating: bool


def describe(request: web.Request, registry: registry_mod.Registry) -> RequestInfo:
    """Label values of `request`, from the same path parsing the handlers route by."""
    method = request.method
    segments = [s for s in request.path.split("/") if s]
    rr = req.parse_resource_path(segments) if segments and segments[0] in ("api", "apis") else None
    dry_run = "All" if "dryRun" in request.query else ""
    if rr is None or registry.lookup(rr.group, rr.version, rr.plural) is None:
        verb = method if rr is None else _verb(request, rr)
        return RequestInfo((verb, dry_run, "", "", "", "", "", COMPONENT), False, method in _MUTATING)
    verb = _verb(request, rr)
    if rr.name or verb == "POST":
        scope = "resource"
    elif rr.namespace:
        scope = "namespace"
    else:
        scope = "cluster"
    labels = (verb, dry_run, rr.group, rr.version, rr.plural, rr.subresource, scope, COMPONENT)
    long_running = verb in ("WATCH", "CONNECT") or rr.subresource in _STREAMING_SUBRESOURCES
    return RequestInfo(labels, long_running, method in _MUTATING)


def _verb(request: web.Request, rr: req.ResourceRequest) -> str:
    """Upstream's reported verb: GET/LIST/WATCH, POST, PUT, PATCH/APPLY, DELETE/DELETECOLLECTION, CONNECT."""
    method = request.method
    if rr.subresource in _CONNECT_SUBRESOURCES:
        return "CONNECT"
    if method in ("GET", "HEAD"):
        if rr.name:
            return "GET"
        return "WATCH" if req.query_flag(request, "watch") else "LIST"
    if method == "PATCH" and request.headers.get("Content-Type", "").startswith("application/apply-patch"):
        return "APPLY"
    if method == "DELETE" and not rr.name:
        return "DELETECOLLECTION"
    return method


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(DURATION_BUCKETS) + 1)  # per bucket, not cumulative; last is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        self.sum += seconds

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*DURATION_BUCKETS, float("inf")), self.counts, strict=True):
            running += count
            out.append((_bound(bound), running))
        return out


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class ApiserverMetrics:
    """Request counters of one logical cluster. `begin()` when a request arrives, `end()` when
    its response is done; `collect()` yields what `/metrics` shows."""

    __slots__ = ("_durations", "_inflight", "_longrunning", "_requests")

    def __init__(self) -> None:
        self._requests: dict[tuple[Labels, str], int] = {}
        self._durations: dict[Labels, _Histogram] = {}
        self._longrunning: dict[tuple[str, ...], int] = {}
        self._inflight = [0, 0]  # readOnly, mutating

    def begin(self, info: RequestInfo) -> float:
        if info.long_running:
            key = _longrunning_key(info.labels)
            self._longrunning[key] = self._longrunning.get(key, 0) + 1
        else:
            self._inflight[info.mutating] += 1
        return time.perf_counter()

    def end(self, info: RequestInfo, started: float, code: int) -> None:
        seconds = time.perf_counter() - started
        if info.long_running:
            key = _longrunning_key(info.labels)
            left = self._longrunning.get(key, 1) - 1
            if left:
                self._longrunning[key] = left
            else:
                self._longrunning.pop(key, None)
        else:
            self._inflight[info.mutating] -= 1
        counted = (info.labels, str(code))
        self._requests[counted] = self._requests.get(counted, 0) + 1
        histogram = self._durations.get(info.labels)
        if histogram is None:
            histogram = self._durations[info.labels] = _Histogram()
        histogram.observe(seconds)

    def collect(self, storage_objects: dict[str, int] | None = None) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "apiserver_request_total",
            "Counter of apiserver requests broken out for each verb, dry run value, group, version, "
            "resource, scope, component, and HTTP response code.",
            labels=(*REQUEST_LABELS, "code"),
        )
        for (labels, code), count in sorted(self._requests.items()):
            total.add_metric((*labels, code), count)
        yield total
        durations = HistogramMetricFamily(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb, dry run value, group, version, "
            "resource, subresource, scope and component.",
            labels=REQUEST_LABELS,
        )
        for labels, histogram in sorted(self._durations.items()):
            durations.add_metric(labels, histogram.buckets(), histogram.sum)
        yield durations
        inflight = GaugeMetricFamily(
            "apiserver_current_inflight_requests",
            "Maximal number of currently used inflight request limit of this apiserver per request "
            "kind in last second.",
            labels=("request_kind",),
        )
        inflight.add_metric(("readOnly",), self._inflight[0])
        inflight.add_metric(("mutating",), self._inflight[1])
        yield inflight
        longrunning = GaugeMetricFamily(
            "apiserver_longrunning_requests",
            "Gauge of all active long-running apiserver requests broken out by verb, group, version, "
            "resource, scope and component. Not all requests are tracked this way.",
            labels=LONGRUNNING_LABELS,
        )
        for labels, count in sorted(self._longrunning.items()):
            longrunning.add_metric(labels, count)
        yield longrunning
        if storage_objects is not None:
            objects = GaugeMetricFamily(
                "apiserver_storage_objects",
                "Number of stored objects at the time of last check split by kind.",
                labels=("resource",),
            )
            for resource, count in sorted(storage_objects.items()):
                objects.add_metric((resource,), count)
            yield objects


def _longrunning_key(labels: Labels) -> tuple[str, ...]:
    return (labels[0], *labels[2:])  # upstream's long-running gauge has no dry_run label


async def storage_objects(store: object) -> dict[str, int]:
    """Objects stored per resource ("pods", "deployments.apps"), counted in the backend now."""
    from socialweb_computer.apiserver import keys
    from socialweb_computer.apiserver import store as store_mod

    assert isinstance(store, store_mod.Store)
    counts: dict[str, int] = {}
    seen: set[str] = set()
    for kind in store.registry.all():
        if kind.verbs == ("create",) or "list" not in kind.verbs:
            continue  # reviews and virtual kinds store nothing
        prefix = keys.kind_prefix(store.cluster, kind)
        if prefix in seen:
            continue  # one kind served at several versions shares its objects
        seen.add(prefix)
        resource = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
        counts[resource] = await store.backend.count(prefix)
    return counts


class _Families:
    """What prometheus_client's `generate_latest` wants: something with `collect()`."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def exposition_text(families: list[Metric]) -> bytes:
    return exposition.generate_latest(_Families(families))  # type: ignore[arg-type]
