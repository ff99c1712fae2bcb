"""What capacity says on Pods and Nodes, in cluster-autoscaler's words.

People and tools read these: `kubectl describe pod` shows them, runbooks grep for
"pod didn't trigger scale-up", dashboards count `TriggeredScaleUp`. So the reasons and
the shape of the messages are upstream's (cluster-autoscaler's EventingScaleUpStatusProcessor
and scale-down actuator); only what is ours (the host budget, a bidder's error) is worded
for this system, in the same form.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

COMPONENT = "cluster-autoscaler"

# On pods
TRIGGERED_SCALE_UP = "TriggeredScaleUp"  # Normal
NOT_TRIGGER_SCALE_UP = "NotTriggerScaleUp"  # Normal, as upstream
FAILED_TO_SCALE_UP = "FailedToScaleUpGroup"  # Warning: a boot failed
# On nodes
SCALE_DOWN = "ScaleDown"  # Normal
SCALE_DOWN_FAILED = "ScaleDownFailed"  # Warning
DELETING_NODE = "DeletingNode"  # Normal: the node is gone from the bidder (a node that died)

# Reasons a pod did not trigger a scale-up (upstream's, then ours in the same form).
MAX_NODES_REACHED = "max node group size reached"
BACKOFF = "in backoff after failed scale-up"
HOST_BUDGET = "host budget reached"
NO_BIDDER = "no bidder configured"

# The taint upstream puts on a node it is removing, so nothing new lands there.
TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"

MARKED = "marked the node as toBeDeleted/unschedulable"
REMOVED = "node removed by cluster autoscaler"
DRAIN_ABORTED = "failed to drain the node, aborting ScaleDown"
EVICTING = "deleting pod for node scale down"


def scale_up(group: str, current: int, new: int, maximum: int) -> str:
    """`pod triggered scale-up: [{sandbox-2cpu-2048mi-8192mi 0->1 (max: 10)}]`"""
    return f"pod triggered scale-up: [{{{group} {current}->{new} (max: {maximum})}}]"


def _counted(reasons: Iterable[str]) -> str:
    counts = Counter(reasons)
    return ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))


def no_scale_up(reasons: Iterable[str]) -> str:
    """`pod didn't trigger scale-up: 1 max node group size reached`"""
    return f"pod didn't trigger scale-up: {_counted(reasons)}"


def would_not_fit(reasons: Iterable[str]) -> str:
    """`pod didn't trigger scale-up (it wouldn't fit if a new node is added): 1 Insufficient memory`"""
    return f"pod didn't trigger scale-up (it wouldn't fit if a new node is added): {_counted(reasons)}"


def failed_scale_up(group: str, error: str, retry_in: float) -> str:
    return f"Scale-up failed for group {group}: {error} (retrying in {retry_in:.0f}s)"
