"""The pure parts of the Job controller's batch/v1 policies: completion indexes and their
compressed interval text ("1,3-5,7"), `podFailurePolicy` rule matching and `successPolicy`
rule matching.

Kept apart from `controllers.job` (its only caller) because none of it touches the store,
the clock or the queue: each function reads a Job spec or a pod and answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Object = dict[str, Any]
Intervals = list[tuple[int, int]]

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
FAILURE_COUNT_KEY = "batch.kubernetes.io/job-index-failure-count"
IGNORED_COUNT_KEY = "batch.kubernetes.io/job-index-ignored-failure-count"
INDEX_ENV = "JOB_COMPLETION_INDEX"


# ---------------------------------------------------------------- index intervals

def parse_indexes(text: str | None, completions: int) -> Intervals:
    """Intervals from a status string; corrupt fragments are skipped and indexes at or past
    `completions` dropped, as the upstream controller reads its own status."""
    result: Intervals = []
    for fragment in (text or "").split(","):
        if not fragment:
            continue
        parts = fragment.split("-")
        try:
            first = int(parts[0])
            last = int(parts[1]) if len(parts) > 1 else first
        except ValueError:
            continue
        if first >= completions:
            break
        last = min(last, completions - 1)
        if result and result[-1][1] == first - 1:
            result[-1] = (result[-1][0], last)
        else:
            result.append((first, last))
    return result


def format_indexes(intervals: Intervals) -> str:
    """Runs of three or more become "a-b"; a run of two stays "a,b"."""
    parts = []
    for first, last in intervals:
        if last == first:
            parts.append(str(first))
        elif last == first + 1:
            parts.append(f"{first},{last}")
        else:
            parts.append(f"{first}-{last}")
    return ",".join(parts)


def merge(intervals: Intervals, indexes: Iterable[int]) -> Intervals:
    """The union of `intervals` and single `indexes`, sorted and coalesced."""
    result: Intervals = []
    for first, last in sorted([*intervals, *((i, i) for i in set(indexes))]):
        if result and first <= result[-1][1] + 1:
            result[-1] = (result[-1][0], max(result[-1][1], last))
        else:
            result.append((first, last))
    return result


def total(intervals: Intervals) -> int:
    return sum(last - first + 1 for first, last in intervals)


def has(intervals: Intervals, index: int) -> bool:
    return any(first <= index <= last for first, last in intervals)


def first_pending(busy: Intervals, count: int, completions: int) -> list[int]:
    """The `count` lowest indexes below `completions` not covered by `busy`."""
    result: list[int] = []
    candidate = 0
    for first, last in [*busy, (completions, completions)]:
        while candidate < min(first, completions) and len(result) < count:
            result.append(candidate)
            candidate += 1
        candidate = max(candidate, last + 1)
    return result


def completion_index(pod: Object) -> int | None:
    """The pod's index from its annotation; None when missing or not a natural number."""
    value = (pod["metadata"].get("annotations") or {}).get(INDEX_KEY)
    try:
        index = int(value) if value is not None else -1
    except ValueError:
        return None
    return index if index >= 0 else None


def annotation_count(pod: Object, key: str) -> int:
    """A per-index failure counter annotation; 0 when missing or malformed."""
    try:
        value = int((pod["metadata"].get("annotations") or {}).get(key, 0))
    except ValueError:
        return 0
    return value if 0 <= value <= 2**31 - 1 else 0


# ---------------------------------------------------------------- podFailurePolicy

def _exit_code_matches(code: int, requirement: Object) -> bool:
    values = requirement.get("values") or []
    operator = requirement.get("operator")
    if operator == "In":
        return code in values
    if operator == "NotIn":
        return code not in values
    return False


def _terminated_container(status: Object, requirement: Object) -> Object | None:
    """The first terminated container (regular, then init) with a non-zero exit code the
    requirement matches."""
    name = requirement.get("containerName")
    for key in ("containerStatuses", "initContainerStatuses"):
        for container in status.get(key) or []:
            terminated = (container.get("state") or {}).get("terminated")
            if not terminated or (name is not None and container.get("name") != name):
                continue
            code = int(terminated.get("exitCode") or 0)
            if code != 0 and _exit_code_matches(code, requirement):
                return container
    return None


def _pod_condition(status: Object, patterns: list[Object]) -> Object | None:
    for cond in status.get("conditions") or []:
        for pattern in patterns:
            wanted = (pattern.get("type"), pattern.get("status", "True"))
            if (cond.get("type"), cond.get("status")) == wanted:
                return cond
    return None


def match_failure(policy: Object | None, pod: Object) -> tuple[str | None, bool, str | None]:
    """(FailJob message or None, whether the failure counts against the backoff limits,
    the matched rule's action or None) for a failed pod, first matching rule wins."""
    if not policy:
        return None, True, None
    meta, status = pod["metadata"], pod.get("status") or {}
    who = f"{meta.get('namespace', '')}/{meta['name']}"
    for index, rule in enumerate(policy.get("rules") or []):
        action = rule.get("action")
        if rule.get("onExitCodes") is not None:
            container = _terminated_container(status, rule["onExitCodes"])
            if container is None:
                continue
            code = container["state"]["terminated"]["exitCode"]
            message = (f"Container {container.get('name')} for pod {who} failed with exit code {code} "
                       f"matching {action} rule at index {index}")
        elif rule.get("onPodConditions"):
            cond = _pod_condition(status, rule["onPodConditions"])
            if cond is None:
                continue
            message = f"Pod {who} has condition {cond.get('type')} matching {action} rule at index {index}"
        else:
            continue
        if action == "Ignore":
            return None, False, action
        if action in ("Count", "FailIndex"):
            return None, True, action
        if action == "FailJob":
            return message, True, action
    return None, True, None


# ---------------------------------------------------------------- successPolicy

def _overlap(rule: Intervals, succeeded: Intervals) -> int:
    return sum(max(0, min(r_last, s_last) - max(r_first, s_first) + 1)
               for r_first, r_last in rule for s_first, s_last in succeeded)


def match_success(policy: Object | None, completions: int, succeeded: Intervals) -> str | None:
    """"Matched rules at index N" for the first rule the succeeded indexes satisfy."""
    if not policy or not succeeded:
        return None
    for index, rule in enumerate(policy.get("rules") or []):
        count = rule.get("succeededCount")
        if rule.get("succeededIndexes") is not None:
            required = parse_indexes(rule["succeededIndexes"], completions)
            if not required:
                continue
            contains = _overlap(required, succeeded)
            if contains == total(required) or (count is not None and contains >= int(count)):
                return f"Matched rules at index {index}"
        elif count is not None and total(succeeded) >= int(count):
            return f"Matched rules at index {index}"
    return None
