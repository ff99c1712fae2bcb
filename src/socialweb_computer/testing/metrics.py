"""Reading a Prometheus scrape in tests, with prometheus_client's own parser.

    samples = metrics.parse(text)
    metrics.value(samples, "apiserver_request_total", verb="POST", code="201")
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, keyed by (name, labels)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def label_values(samples: Samples, name: str, label: str) -> set[str]:
    return {dict(ls).get(label, "") for (n, ls) in samples if n == name}
