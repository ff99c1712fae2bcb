"""The Job controller (NonIndexed completion mode): run pods until `completions` of them
succeed, give up after `backoffLimit` failures or `activeDeadlineSeconds`, stop and
resume on `suspend`, and delete finished Jobs after `ttlSecondsAfterFinished`.

The capacity logic reads what this writes: `status.active/ready/succeeded/failed`,
`startTime`/`completionTime` and the conditions Suspended, SuccessCriteriaMet + Complete,
FailureTarget + Failed. Pod phases come from whoever runs pods (a node, or a test through
pods/status). Timers exist only for Jobs with a pending deadline or TTL.
Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from socialweb_computer.api import errors, objects
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework, podcontrol, replicaset

Object = dict[str, Any]
COMPONENT = "job-controller"
MANAGER = "kube-controller-manager"

# Terminal outcomes: (reason, message, event type, interim condition, final condition).
OUTCOMES = {
    "CompletionsReached": ("Reached expected number of succeeded pods", events.NORMAL,
                           "SuccessCriteriaMet", "Complete"),
    "BackoffLimitExceeded": ("Job has reached the specified backoff limit", events.WARNING,
                             "FailureTarget", "Failed"),
    "DeadlineExceeded": ("Job was active longer than specified deadline", events.WARNING,
                         "FailureTarget", "Failed"),
}


def finished(job: Object) -> str:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return ""


def _condition(type_: str, status: str, reason: str, message: str, now: str) -> Object:
    return {"type": type_, "status": status, "lastProbeTime": now, "lastTransitionTime": now,
            "reason": reason, "message": message}


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
        pods = self.owned_pods(job)
        active = [p for p in pods if replicaset.active(p)]
        succeeded = max(sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"),
                        int(status.get("succeeded") or 0))
        failed = max(sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed"),
                     int(status.get("failed") or 0))
        now_t = self.clock.now()
        now = objects.rfc3339(now_t)
        outcome = self._outcome(job, spec, status, succeeded, failed, now_t)
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
            active = await self._manage(job, spec, active, succeeded)
        status.update({"active": len(active), "succeeded": succeeded, "failed": failed,
                       "ready": sum(1 for p in active if framework.is_ready(p)),
                       "terminating": sum(1 for p in pods if p["metadata"].get("deletionTimestamp"))})
        status.setdefault("uncountedTerminatedPods", {})
        status["conditions"] = self._conditions(job, status, outcome, now)
        if outcome and outcome[0] == "CompletionsReached":
            status["completionTime"] = now
        for field in ("active", "succeeded", "failed"):
            if not status[field]:
                status.pop(field)
        self._schedule_deadline(job, spec, status, now_t, bool(outcome))
        if status != (job.get("status") or {}):
            await self._write_status(job, status)
        if outcome:
            await self.recorder.event(COMPONENT, job, OUTCOMES[outcome[0]][1],
                                      "Completed" if outcome[0] == "CompletionsReached" else outcome[0],
                                      "Job completed" if outcome[0] == "CompletionsReached" else outcome[1])

    def _outcome(self, job: Object, spec: Object, status: Object, succeeded: int, failed: int,
                 now: datetime.datetime) -> tuple[str, str] | None:
        completions = spec.get("completions")
        if completions is not None and succeeded >= int(completions):
            return "CompletionsReached", OUTCOMES["CompletionsReached"][0]
        if completions is None and succeeded > 0 and not any(
                replicaset.active(p) for p in self.owned_pods(job)):
            return "CompletionsReached", OUTCOMES["CompletionsReached"][0]
        if failed > int(spec.get("backoffLimit", 6)):
            return "BackoffLimitExceeded", OUTCOMES["BackoffLimitExceeded"][0]
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and status.get("startTime") and not spec.get("suspend"):
            started = objects.parse_time(status["startTime"])
            if started + datetime.timedelta(seconds=int(deadline)) <= now:
                return "DeadlineExceeded", OUTCOMES["DeadlineExceeded"][0]
        return None

    async def _manage(self, job: Object, spec: Object, active: list[Object], succeeded: int) -> list[Object]:
        parallelism = int(spec.get("parallelism", 1))
        completions = spec.get("completions")
        if completions is None:
            want = parallelism if succeeded == 0 else len(active)
        else:
            want = min(parallelism, int(completions) - succeeded)
        if len(active) < want:
            for _ in range(want - len(active)):
                active.append(await self._create_pod(job))
        elif len(active) > want:
            ranked = sorted(active, key=replicaset._delete_rank)
            for pod in ranked[: len(active) - want]:
                await self._delete_pod(job, pod)
            active = ranked[len(active) - want:]
        return active

    def _conditions(
        self, job: Object, status: Object, outcome: tuple[str, str] | None, now: str
    ) -> list[Object]:
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
            reason, message = outcome
            _msg, _type, interim, final = OUTCOMES[reason]
            conditions.append(_condition(interim, "True", reason, message, now))
            conditions.append(_condition(final, "True", reason, message, now))
        return conditions

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

    async def _create_pod(self, job: Object) -> Object:
        ref = podcontrol.controller_ref(job, api_version="batch/v1", kind="Job")
        return await podcontrol.create(self.store, self.pods.kind, self.recorder, COMPONENT, job, ref,
                                       manager=MANAGER)

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
