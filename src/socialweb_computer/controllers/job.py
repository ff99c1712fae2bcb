"""The Job controller: run pods until `completions` of them succeed (NonIndexed), or until
every completion index 0..completions-1 has a succeeded pod (Indexed); give up after
`backoffLimit` failures, `activeDeadlineSeconds`, a `podFailurePolicy` FailJob rule, or
(Indexed with `backoffLimitPerIndex`) too many failed indexes; finish early on a
`successPolicy` rule; stop and resume on `suspend`; delete finished Jobs after
`ttlSecondsAfterFinished`.

The capacity logic reads what this writes: `status.active/ready/succeeded/failed`,
`completedIndexes`/`failedIndexes`, `startTime`/`completionTime` and the conditions
Suspended, SuccessCriteriaMet + Complete, FailureTarget + Failed. Pod phases come from
whoever runs pods (a node, or a test through pods/status). Timers exist only for Jobs with
a pending deadline or TTL. Rule matching and index arithmetic live in `jobpolicy`.
Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework, jobpolicy, podcontrol, replicaset

Object = dict[str, Any]
COMPONENT = "job-controller"
MANAGER = "kube-controller-manager"
CONTROLLER_NAME = "kubernetes.io/job-controller"
# names.MaxGeneratedNameLength: a generateName longer than this is cut before the suffix.
MAX_GENERATE_NAME = 58

# Fixed messages of the terminal reasons; PodFailurePolicy and SuccessPolicy carry their own.
MESSAGES = {
    "CompletionsReached": "Reached expected number of succeeded pods",
    "BackoffLimitExceeded": "Job has reached the specified backoff limit",
    "DeadlineExceeded": "Job was active longer than specified deadline",
    "MaxFailedIndexesExceeded": "Job has exceeded the specified maximal number of failed indexes",
    "FailedIndexes": "Job has failed indexes",
}


@dataclasses.dataclass(frozen=True)
class Outcome:
    reason: str
    message: str
    success: bool

    @property
    def conditions(self) -> tuple[str, str]:
        """(interim, final) condition types, written together."""
        return ("SuccessCriteriaMet", "Complete") if self.success else ("FailureTarget", "Failed")


@dataclasses.dataclass
class Counts:
    """What one sync learned from the pods and the previous status."""

    succeeded: int
    failed: int
    completed: jobpolicy.Intervals | None = None      # Indexed only
    failed_indexes: jobpolicy.Intervals | None = None  # Indexed with backoffLimitPerIndex only


def finished(job: Object) -> str:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return ""


def indexed(spec: Object) -> bool:
    return spec.get("completionMode") == "Indexed"


def _condition(type_: str, status: str, reason: str, message: str, now: str) -> Object:
    return {"type": type_, "status": status, "lastProbeTime": now, "lastTransitionTime": now,
            "reason": reason, "message": message}


def _phase(pod: Object) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _by_age(pods: list[Object]) -> list[Object]:
    return sorted(pods, key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))


def _valid_index(pod: Object, completions: int) -> int | None:
    index = jobpolicy.completion_index(pod)
    return index if index is not None and index < completions else None


class JobController:
    def __init__(self, store: store_mod.Store, informers: framework.Informers, clock: framework.Clock,
                 recorder: events.Recorder) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.queue = framework.WorkQueue(clock)
        self.jobs = informers.get("batch", "jobs")
        self.pods = informers.get("", "pods")
        self.jobs.handlers.append(lambda _e, new, old: self.queue.add(framework.key_of(new or old)))
        self.pods.handlers.append(self._on_pod)

    def _on_pod(self, event: str, new: Object | None, old: Object | None) -> None:
        framework.enqueue_controller(self.queue, "Job", new, old)

    def owned_pods(self, job: Object) -> list[Object]:
        return framework.controlled_by(self.pods, job)

    async def sync(self, key: tuple[str, str]) -> None:
        job = self.jobs.get(*key)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        if finished(job):
            await self._after_finish(job)
            return
        spec, status = job.get("spec") or {}, copy.deepcopy(job.get("status") or {})
        if spec.get("managedBy", CONTROLLER_NAME) != CONTROLLER_NAME:
            return  # another controller (e.g. MultiKueue) runs this Job
        pods = self.owned_pods(job)
        active = [p for p in pods if replicaset.active(p)]
        counts = self._count(spec, status, pods)
        now_t = self.clock.now()
        now = objects.rfc3339(now_t)
        outcome = self._early_outcome(spec, status, pods, counts, now_t)
        if outcome:
            for pod in active:
                await self._delete_pod(job, pod)
            active = []
        elif spec.get("suspend"):
            for pod in active:
                await self._delete_pod(job, pod)
            active = []
            status.pop("startTime", None)
        else:
            if not status.get("startTime"):
                status["startTime"] = now
            active = await self._manage(job, spec, pods, active, counts)
        outcome = outcome or self._completion(spec, counts, active)
        self._fill_status(spec, status, pods, active, counts)
        status["conditions"] = self._conditions(job, status, outcome, now)
        if not status["conditions"]:
            status.pop("conditions")
        if outcome and outcome.success:
            status["completionTime"] = now
        self._schedule_deadline(job, spec, status, now_t, bool(outcome))
        if status != (job.get("status") or {}):
            await self._write_status(job, status)
        if outcome:
            await self._record_finish(job, outcome)

    # ------------------------------------------------------------ counting

    def _count(self, spec: Object, status: Object, pods: list[Object]) -> Counts:
        """Counters never go down: pods deleted since the last sync stay counted in status."""
        policy = spec.get("podFailurePolicy")
        counted = [p for p in pods if _phase(p) == "Failed" and jobpolicy.match_failure(policy, p)[1]]
        failed = max(len(counted), int(status.get("failed") or 0))
        if not indexed(spec):
            succeeded = sum(1 for p in pods if _phase(p) == "Succeeded")
            succeeded = max(succeeded, int(status.get("succeeded") or 0))
            return Counts(succeeded, failed)
        completions = int(spec.get("completions") or 0)
        done = [_valid_index(p, completions) for p in pods if _phase(p) == "Succeeded"]
        completed = jobpolicy.merge(jobpolicy.parse_indexes(status.get("completedIndexes"), completions),
                                    (i for i in done if i is not None))
        counts = Counts(jobpolicy.total(completed), failed, completed=completed)
        if spec.get("backoffLimitPerIndex") is not None:
            lost = [_valid_index(p, completions) for p in pods if self._index_failed(spec, p)]
            counts.failed_indexes = jobpolicy.merge(
                jobpolicy.parse_indexes(status.get("failedIndexes"), completions),
                (i for i in lost if i is not None and not jobpolicy.has(completed, i)))
        return counts

    @staticmethod
    def _index_failed(spec: Object, pod: Object) -> bool:
        """A failed pod ends its index on a FailIndex rule, or when its counted failures
        reach backoffLimitPerIndex."""
        if _phase(pod) != "Failed":
            return False
        _msg, count, action = jobpolicy.match_failure(spec.get("podFailurePolicy"), pod)
        if action == "FailIndex":
            return True
        limit = int(spec.get("backoffLimitPerIndex") or 0)
        return count and jobpolicy.annotation_count(pod, jobpolicy.FAILURE_COUNT_KEY) >= limit

    # ------------------------------------------------------------ outcomes

    def _early_outcome(self, spec: Object, status: Object, pods: list[Object], counts: Counts,
                       now: datetime.datetime) -> Outcome | None:
        """Terminal states decided before managing pods, in the upstream order: a FailJob
        rule, the backoff limit, the deadline, failed indexes, then a success policy."""
        policy = spec.get("podFailurePolicy")
        for pod in _by_age([p for p in pods if _phase(p) == "Failed"]):
            message = jobpolicy.match_failure(policy, pod)[0]
            if message:
                return Outcome("PodFailurePolicy", message, False)
        if counts.failed > int(spec.get("backoffLimit", 6)):
            return self._fixed("BackoffLimitExceeded", False)
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and status.get("startTime") and not spec.get("suspend"):
            started = objects.parse_time(status["startTime"])
            if started + datetime.timedelta(seconds=int(deadline)) <= now:
                return self._fixed("DeadlineExceeded", False)
        if counts.failed_indexes is not None:
            lost, limit = jobpolicy.total(counts.failed_indexes), spec.get("maxFailedIndexes")
            if limit is not None and lost > int(limit):
                return self._fixed("MaxFailedIndexesExceeded", False)
            if lost and lost + counts.succeeded >= int(spec.get("completions") or 0):
                return self._fixed("FailedIndexes", False)
        if counts.completed is not None:
            message = jobpolicy.match_success(spec.get("successPolicy"), int(spec.get("completions") or 0),
                                              counts.completed)
            if message:
                return Outcome("SuccessPolicy", message, True)
        return None

    @staticmethod
    def _fixed(reason: str, success: bool) -> Outcome:
        return Outcome(reason, MESSAGES[reason], success)

    def _completion(self, spec: Object, counts: Counts, active: list[Object]) -> Outcome | None:
        completions = spec.get("completions")
        if completions is not None and counts.succeeded >= int(completions):
            return self._fixed("CompletionsReached", True)
        if completions is None and counts.succeeded > 0 and not active:
            return self._fixed("CompletionsReached", True)
        return None

    # ------------------------------------------------------------ pods

    async def _manage(self, job: Object, spec: Object, pods: list[Object], active: list[Object],
                      counts: Counts) -> list[Object]:
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        if completions is None:
            want = parallelism if counts.succeeded == 0 else len(active)
        else:
            want = max(0, min(parallelism, int(completions) - counts.succeeded))
        doomed = self._surplus(spec, active, want)
        if doomed:
            # Like upstream: a sync that deletes pods creates none.
            for pod in doomed:
                await self._delete_pod(job, pod)
            return [p for p in active if p not in doomed]
        missing = want - len(active)
        if spec.get("podReplacementPolicy") == "Failed":
            missing -= sum(1 for p in pods if p["metadata"].get("deletionTimestamp") and _phase(p) not in (
                "Succeeded", "Failed"))
        if missing <= 0:
            return active
        missing = min(missing, podcontrol.BURST)  # MaxPodCreateDeletePerSync

        async def create() -> None:
            active.append(await self._create_pod(job, None, pods))

        if not indexed(spec):
            await podcontrol.slow_start(missing, create)
            return active
        busy = jobpolicy.merge([*(counts.completed or []), *(counts.failed_indexes or [])],
                               self._indexes_of(active, int(completions or 0)))
        indexes = jobpolicy.first_pending(busy, missing, int(completions or 0))
        pending = iter(indexes)

        async def create_next() -> None:
            active.append(await self._create_pod(job, next(pending), pods))

        await podcontrol.slow_start(len(indexes), create_next)
        return active

    @staticmethod
    def _indexes_of(pods: list[Object], completions: int) -> list[int]:
        return [i for i in (_valid_index(p, completions) for p in pods) if i is not None]

    @staticmethod
    def _surplus(spec: Object, active: list[Object], want: int) -> list[Object]:
        """Active pods to delete: for Indexed Jobs those without a valid index and all but one
        pod per index, then the cheapest to lose until at most `want` remain."""
        doomed: list[Object] = []
        keep = list(active)
        if indexed(spec):
            completions = int(spec.get("completions") or 0)
            keep, seen = [], set()
            for pod in sorted(active, key=replicaset._delete_rank, reverse=True):
                index = _valid_index(pod, completions)
                if index is None or index in seen:
                    doomed.append(pod)
                else:
                    seen.add(index)
                    keep.append(pod)
        extra = len(keep) - want
        if extra > 0:
            doomed.extend(sorted(keep, key=replicaset._delete_rank)[:extra])
        return doomed

    def _pod_for(self, job: Object, index: int | None, pods: list[Object]) -> Object:
        """The pod to create: the template, and for an Indexed Job its index as annotation,
        label, env var, hostname and name prefix (plus the per-index failure counters)."""
        ref = podcontrol.controller_ref(job, api_version="batch/v1", kind="Job")
        pod = podcontrol.from_template(job, ref)
        if index is None:
            return pod
        name, meta, pod_spec = job["metadata"]["name"], pod["metadata"], pod["spec"]
        annotations = meta.setdefault("annotations", {})
        annotations[jobpolicy.INDEX_KEY] = str(index)
        meta["labels"][jobpolicy.INDEX_KEY] = str(index)
        suffix = f"-{index}-"
        meta["generateName"] = (name + suffix if len(name + suffix) <= MAX_GENERATE_NAME
                                else name[: MAX_GENERATE_NAME - len(suffix)] + suffix)
        pod_spec["hostname"] = f"{name}-{index}"
        for key in ("initContainers", "containers"):
            for container in pod_spec.get(key) or []:
                env = container.setdefault("env", [])
                if not any(e.get("name") == jobpolicy.INDEX_ENV for e in env):
                    env.append({"name": jobpolicy.INDEX_ENV, "valueFrom": {"fieldRef": {
                        "fieldPath": f"metadata.labels['{jobpolicy.INDEX_KEY}']"}}})
        spec = job.get("spec") or {}
        if spec.get("backoffLimitPerIndex") is not None:
            annotations.update(self._failure_counts(spec, index, pods))
        return pod

    @staticmethod
    def _failure_counts(spec: Object, index: int, pods: list[Object]) -> dict[str, str]:
        """The counters a replacement pod inherits from the index's latest failed pod."""
        completions = int(spec.get("completions") or 0)
        failed = [p for p in pods if _phase(p) == "Failed" and _valid_index(p, completions) == index]
        if not failed:
            return {jobpolicy.FAILURE_COUNT_KEY: "0"}
        last = max(failed, key=lambda p: (jobpolicy.annotation_count(p, jobpolicy.FAILURE_COUNT_KEY)
                                          + jobpolicy.annotation_count(p, jobpolicy.IGNORED_COUNT_KEY),
                                          p["metadata"].get("creationTimestamp", "")))
        counted = jobpolicy.annotation_count(last, jobpolicy.FAILURE_COUNT_KEY)
        ignored = jobpolicy.annotation_count(last, jobpolicy.IGNORED_COUNT_KEY)
        if jobpolicy.match_failure(spec.get("podFailurePolicy"), last)[1]:
            counted += 1
        else:
            ignored += 1
        result = {jobpolicy.FAILURE_COUNT_KEY: str(counted)}
        if ignored:
            result[jobpolicy.IGNORED_COUNT_KEY] = str(ignored)
        return result

    # ------------------------------------------------------------ status

    @staticmethod
    def _fill_status(spec: Object, status: Object, pods: list[Object], active: list[Object],
                     counts: Counts) -> None:
        status.update({"active": len(active), "succeeded": counts.succeeded, "failed": counts.failed,
                       "ready": sum(1 for p in active if framework.is_ready(p)),
                       "terminating": sum(1 for p in pods if p["metadata"].get("deletionTimestamp"))})
        status.setdefault("uncountedTerminatedPods", {})
        if counts.completed is not None:
            status["completedIndexes"] = jobpolicy.format_indexes(counts.completed)
        if counts.failed_indexes is not None:
            # A pointer upstream: "" (not absent) once backoffLimitPerIndex is in use.
            status["failedIndexes"] = jobpolicy.format_indexes(counts.failed_indexes)
        for field in ("active", "succeeded", "failed", "completedIndexes"):
            if not status.get(field):
                status.pop(field, None)

    def _conditions(self, job: Object, status: Object, outcome: Outcome | None, now: str) -> list[Object]:
        conditions = list(status.get("conditions") or [])
        spec = job.get("spec") or {}
        suspended = next((c for c in conditions if c.get("type") == "Suspended"), None)
        if spec.get("suspend") and not outcome and (suspended is None or suspended["status"] != "True"):
            conditions = [c for c in conditions if c.get("type") != "Suspended"]
            conditions.append(_condition("Suspended", "True", "JobSuspended", "Job suspended", now))
        elif not spec.get("suspend") and suspended is not None and suspended["status"] == "True":
            conditions = [c for c in conditions if c.get("type") != "Suspended"]
            conditions.append(_condition("Suspended", "False", "JobResumed", "Job resumed", now))
        if outcome:
            for type_ in outcome.conditions:
                conditions.append(_condition(type_, "True", outcome.reason, outcome.message, now))
        return conditions

    async def _record_finish(self, job: Object, outcome: Outcome) -> None:
        if outcome.success:
            await self.recorder.event(COMPONENT, job, events.NORMAL, "Completed", "Job completed")
        else:
            await self.recorder.event(COMPONENT, job, events.WARNING, outcome.reason, outcome.message)

    def _schedule_deadline(self, job: Object, spec: Object, status: Object, now: datetime.datetime,
                           done: bool) -> None:
        deadline = spec.get("activeDeadlineSeconds")
        if done or deadline is None or spec.get("suspend") or not status.get("startTime"):
            return
        due = objects.parse_time(status["startTime"]) + datetime.timedelta(seconds=int(deadline))
        self.queue.add_after(framework.key_of(job), (due - now).total_seconds())

    async def _after_finish(self, job: Object) -> None:
        for pod in self.owned_pods(job):
            if replicaset.active(pod):
                await self._delete_pod(job, pod)
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        status = job.get("status") or {}
        failed = [c for c in status.get("conditions") or [] if c.get("type") == "Failed"]
        finish = status.get("completionTime") or (failed[0].get("lastTransitionTime") if failed else None)
        if not finish:
            return
        due = objects.parse_time(finish) + datetime.timedelta(seconds=int(ttl))
        wait = (due - self.clock.now()).total_seconds()
        if wait > 0:
            self.queue.add_after(framework.key_of(job), wait)
            return
        try:
            await self.store.delete(self.jobs.kind, job["metadata"]["namespace"], job["metadata"]["name"],
                                    store_mod.DeleteOptions(propagation_policy="Foreground",
                                                            precondition_uid=job["metadata"]["uid"]))
        except errors.StatusError as e:
            if e.code not in (404, 409):
                raise

    async def _create_pod(self, job: Object, index: int | None, pods: list[Object]) -> Object:
        return await podcontrol.create(self.store, self.pods.kind, self.recorder, COMPONENT, job, {},
                                       manager=MANAGER, pod=self._pod_for(job, index, pods))

    async def _delete_pod(self, job: Object, pod: Object) -> None:
        await podcontrol.delete(self.store, self.pods.kind, self.recorder, COMPONENT, job, pod)

    async def _write_status(self, job: Object, status: Object) -> None:
        updated = copy.deepcopy(job)
        updated["status"] = status
        try:
            meta = job["metadata"]
            await self.store.update(self.jobs.kind, meta["namespace"], meta["name"], updated,
                                    store_mod.WriteOptions(field_manager=MANAGER, subresource="status",
                                                           field_validation="Ignore"))
        except errors.StatusError as e:
            if e.code != 404:
                raise
