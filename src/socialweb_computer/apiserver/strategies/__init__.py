"""Per-kind behaviour: defaults, validation and update rules.

The generic store (`store.py`) runs the hooks of a kind's `Strategy` in a fixed order:
prepare (may mutate) → validate (must not mutate; returns causes) → write. A kind
without a module here gets `Strategy()`. Modules register by adding a row to `STRATEGIES`.
"""

from __future__ import annotations

from socialweb_computer.apiserver.strategies import (
    apiextensions,
    autoscaling,
    base,
    batch,
    certificates,
    control,
    core,
    networking,
    rbac,
    storage,
    workloads,
)

Strategy = base.Strategy

STRATEGIES: dict[tuple[str, str], base.Strategy] = {
    **core.STRATEGIES,
    **workloads.STRATEGIES,
    **apiextensions.STRATEGIES,
    **rbac.STRATEGIES,
    **autoscaling.STRATEGIES,
    **batch.STRATEGIES,
    **certificates.STRATEGIES,
    **control.STRATEGIES,
    **networking.STRATEGIES,
    **storage.STRATEGIES,
}

_DEFAULT = base.Strategy()


def for_kind(group: str, kind: str) -> base.Strategy:
    return STRATEGIES.get((group, kind), _DEFAULT)
