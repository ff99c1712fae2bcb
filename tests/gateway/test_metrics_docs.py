"""docs/observability.md documents the metrics the code serves: every family a tenant's and
the host's `/metrics` yield is in its tables with the same type and label names, and every
row there is served (those a capacity controller's own `collect()` adds aside: capacity's
tests check them)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from socialweb_computer.apiserver import metrics as apiserver_metrics
from socialweb_computer.gateway import metrics, observer
from socialweb_computer.guest import store as image_store
from socialweb_computer.storage import base as storage
from socialweb_computer.testing import capacity as fake_capacity

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
# Families prometheus_client's own collectors add (one table row names them together).
RUNTIME = re.compile(r"^(process_|python_gc_|python_info)")


def documented(section: str) -> dict[str, tuple[str, frozenset[str], str]]:
    """name → (type, label names, the row's meaning) of the metrics table under `## {section}`."""
    text = DOC.read_text()
    body = text.split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, frozenset[str], str]] = {}
    labels_of_previous: frozenset[str] = frozenset()
    for line in body.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`") or "*" in cells[0]:
            continue
        name, kind, labels, meaning = cells
        without = re.fullmatch(r"the same, without `(\w+)`", labels)
        if without:
            names = labels_of_previous - {without.group(1)}
        else:
            # Backticked words outside parentheses are label names; inside, their values.
            names = frozenset(re.findall(r"`([\w.]+)`", re.sub(r"\([^)]*\)", "", labels)))
        rows[name.strip("`")] = (kind, names, meaning)
        labels_of_previous = names
    assert rows, f"no metrics table under '## {section}' in {DOC.name}"
    return rows


def served(families: list[Metric]) -> dict[str, tuple[str, frozenset[str]]]:
    out = {}
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "")
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        out[name] = (family.type, frozenset(labels))
    return out


def test_tenant_metrics_are_documented() -> None:
    recorder = apiserver_metrics.ApiserverMetrics()
    labels = ("LIST", "", "", "v1", "configmaps", "", "namespace", "apiserver")
    short = apiserver_metrics.RequestInfo(labels, long_running=False, mutating=False)
    recorder.end(short, recorder.begin(short), 200)
    watch = apiserver_metrics.RequestInfo(("WATCH", *labels[1:]), long_running=True, mutating=False)
    recorder.begin(watch)  # still open: the long-running gauge has a sample
    code = served(list(recorder.collect({"configmaps": 1})))
    doc = documented("Tenant metrics")
    assert set(code) == set(doc)
    for name, (kind, label_names) in code.items():
        assert (doc[name][0], doc[name][1]) == (kind, label_names), name


def test_host_metrics_are_documented() -> None:
    changes = observer.Changes()
    view = observer.TenantView("ci", changes, observer.EventLog(changes))
    view.on_write(SimpleNamespace(group="", plural="nodes"), "ADDED",
                  {"metadata": {"name": "n", "labels": {observer.BIDDER_LABEL: "sandbox"}},
                   "status": {"conditions": [{"type": "Ready", "status": "True"}]}}, None)
    commits = storage.LatencyRecorder()
    commits.observe(0.002)
    stats = storage.Statistics(backend="sqlite", revision=3, compacted_revision=0, watches=1, size_bytes=4096,
                               commits=commits.snapshot())
    provider = fake_capacity.FakeCapacity(fake_capacity.Snapshot(
        budget=(fake_capacity.Budget("vcpu", "cores", 2, 8),),
        nodes=(fake_capacity.RentedNode("n", "ci", "sandbox", "Ready", 2, 2048, "img", "", ""),)))
    boots = {"sandbox": commits.snapshot()}
    families = list(metrics.collect(clusters=[{"name": "ci", "phase": "Ready"}], views={"ci": view},
                                    store=stats, capacity=provider, boots=boots,
                                    images=image_store.Contents(images=2, building=1),
                                    builds=image_store.BuildCounts(built=1)))
    families += [f for c in metrics.process_collectors() for f in c.collect()]
    code = {name: v for name, v in served(families).items() if not RUNTIME.match(name)}
    doc = {name: v for name, v in documented("Host metrics").items() if not RUNTIME.match(name)}
    from_capacity_collect = {name for name, (_, _, meaning) in doc.items() if "`collect()`" in meaning}
    assert set(code) - set(doc) == set(), "served but not documented"
    assert set(doc) - set(code) - from_capacity_collect == set(), "documented but not served"
    for name, (kind, label_names) in code.items():
        assert (doc[name][0], doc[name][1]) == (kind, label_names), name
    assert any(RUNTIME.match(name) for name in served(families))


class _BootsToo(fake_capacity.FakeCapacity):
    """A provider that also times boots: the gateway's own family must stay the only one."""

    def collect(self):  # type: ignore[override]
        yield from super().collect()
        yield HistogramMetricFamily("socialweb_node_boot_duration_seconds", "again", labels=("bidder",))


def test_a_provider_cannot_duplicate_a_family_the_gateway_serves() -> None:
    families = list(metrics.collect(clusters=[], views={}, store=None,
                                    capacity=_BootsToo(fake_capacity.Snapshot())))
    names = [family.name for family in families]
    assert names.count("socialweb_node_boot_duration_seconds") == 1
    assert "socialweb_rental_decisions" in names
    text = apiserver_metrics.exposition_text(families).decode()  # what the gateway serves
    assert text.count("# TYPE socialweb_node_boot_duration_seconds ") == 1
    assert list(text_string_to_metric_families(text))  # the scrape parses

