"""The CronJob controller: start a Job at each time the schedule names, as upstream's
cronjob-controller (v2) does.

- Schedules are read with `api.cron` (robfig/cron's rules), in `spec.timeZone` when set.
- Only the most recent missed start is run (after downtime a CronJob does not catch up on
  every start it missed); more than 100 missed starts warn `TooManyMissedTimes`; a start
  older than `startingDeadlineSeconds` is skipped with `MissSchedule`.
- `concurrencyPolicy`: Allow runs side by side, Forbid skips a start while a Job is active
  (`JobAlreadyActive`), Replace deletes the active Jobs first.
- `suspend` stops new starts; `successfulJobsHistoryLimit` / `failedJobsHistoryLimit` keep
  that many finished Jobs (oldest deleted first).
- Jobs are named `<cronjob>-<minutes since the epoch of the scheduled time>`, so a start is
  never made twice; they carry a controller ownerReference and the
  `batch.kubernetes.io/cronjob-scheduled-timestamp` annotation.
- Status: `active` (references to running Jobs), `lastScheduleTime`, `lastSuccessfulTime`.
  Events: SuccessfulCreate, SuccessfulDelete, SawCompletedJob, MissingJob, UnexpectedJob,
  JobAlreadyActive, MissSchedule, TooManyMissedTimes, UnparseableSchedule, UnknownTimeZone.

No polling: each CronJob has one timer, due at its next start (plus 100 ms, as upstream).
Started by `controllers.manager.Manager`.
"""

from __future__ import annotations

import copy
import datetime
import zoneinfo
from typing import Any

from socialweb_computer.api import cron, errors, objects
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import events, framework, job, podcontrol

Object = dict[str, Any]
COMPONENT = "cronjob-controller"
MANAGER = "kube-controller-manager"
SCHEDULED_TIMESTAMP = "batch.kubernetes.io/cronjob-scheduled-timestamp"
NEXT_SCHEDULE_DELTA = 0.1
MANY_MISSED = 100


def _time(value: Any) -> datetime.datetime | None:
    try:
        return objects.parse_time(value) if value else None
    except ValueError:
        return None


def _zone(cj: Object) -> datetime.tzinfo:
    name = (cj.get("spec") or {}).get("timeZone")
    return zoneinfo.ZoneInfo(name) if name else datetime.UTC


def most_recent_schedule(
    cj: Object, now: datetime.datetime, schedule: cron.Schedule, *, with_deadline: bool
) -> tuple[datetime.datetime, datetime.datetime | None, int]:
    """mostRecentScheduleTime: (earliest time considered, most recent start due by `now` or None,
    roughly how many starts were missed)."""
    spec, status = cj.get("spec") or {}, cj.get("status") or {}
    earliest = _time(status.get("lastScheduleTime")) or _time(cj["metadata"].get("creationTimestamp")) or now
    deadline = spec.get("startingDeadlineSeconds")
    if with_deadline and isinstance(deadline, int):
        earliest = max(earliest, now - datetime.timedelta(seconds=deadline))
    zone = _zone(cj)
    t1 = schedule.next(earliest, zone)
    if t1 is None or now < t1:
        return earliest, None, 0
    t2 = schedule.next(t1, zone)
    if t2 is None or now < t2:
        return earliest, t1, 0
    between = round((t2 - t1).total_seconds())
    if between < 1:
        return earliest, None, 0
    missed = int((now - t1).total_seconds()) // between + 1
    recent: datetime.datetime | None = None
    probe = schedule.next(t1 + datetime.timedelta(seconds=(missed - 2) * between), zone)
    while probe is not None and probe <= now:
        recent = probe
        probe = schedule.next(probe, zone)
    return earliest, recent, missed


def job_name(cj: Object, scheduled: datetime.datetime) -> str:
    return f"{cj['metadata']['name']}-{int(scheduled.timestamp()) // 60}"


def _finished(j: Object) -> str:
    return job.finished(j)


class CronJobController:
    def __init__(
        self,
        store: store_mod.Store,
        informers: framework.Informers,
        clock: framework.Clock,
        recorder: events.Recorder,
    ) -> None:
        self.store = store
        self.clock = clock
        self.recorder = recorder
        self.queue = framework.WorkQueue(clock)
        self.cronjobs = informers.get("batch", "cronjobs")
        self.jobs = informers.get("batch", "jobs")
        self.cronjobs.handlers.append(self._on_cronjob)
        self.jobs.handlers.append(self._on_job)

    def _on_cronjob(self, event: str, new: Object | None, old: Object | None) -> None:
        self.queue.add(framework.key_of(new or old))  # type: ignore[arg-type]

    def _on_job(self, event: str, new: Object | None, old: Object | None) -> None:
        framework.enqueue_controller(self.queue, "CronJob", new, old)

    async def sync(self, key: tuple[str, str]) -> None:
        namespace, name = key
        cached = self.cronjobs.get(namespace, name)
        if cached is None:
            return
        cj = copy.deepcopy(cached)
        owned = framework.controlled_by(self.jobs, cj)
        status = cj.setdefault("status", {})
        before = copy.deepcopy(status)
        await self._reconcile_active(cj, owned)
        requeue = await self._schedule(cj, owned)
        await self._clean_up(cj, framework.controlled_by(self.jobs, cj))
        if status != before:
            await self._write_status(cj)
        if requeue is not None:
            self.queue.add_after(key, max(requeue, 0.0))

    # ------------------------------------------------------------ active jobs

    async def _reconcile_active(self, cj: Object, owned: list[Object]) -> None:
        status = cj["status"]
        active = list(status.get("active") or [])
        uids = {ref.get("uid") for ref in active}
        for j in owned:
            state = _finished(j)
            uid = j["metadata"].get("uid")
            if uid not in uids and not state:
                await self.recorder.event(
                    COMPONENT,
                    cj,
                    events.WARNING,
                    "UnexpectedJob",
                    f"Saw a job that the controller did not create or forgot: {j['metadata']['name']}",
                )
            elif uid in uids and state:
                active = [ref for ref in active if ref.get("uid") != uid]
                await self.recorder.event(
                    COMPONENT,
                    cj,
                    events.NORMAL,
                    "SawCompletedJob",
                    f"Saw completed job: {j['metadata']['name']}, condition: {state}",
                )
            if state == "Complete":
                completed = (j.get("status") or {}).get("completionTime")
                last = _time(status.get("lastSuccessfulTime"))
                done = _time(completed)
                if done is not None and (last is None or done > last):
                    status["lastSuccessfulTime"] = completed
        present = {j["metadata"].get("uid") for j in owned}
        for ref in list(active):
            if ref.get("uid") in present:
                continue
            try:
                await self.store.get(self.jobs.kind, ref.get("namespace", ""), ref.get("name", ""))
            except errors.StatusError as e:
                if e.code != 404:
                    raise
                await self.recorder.event(
                    COMPONENT, cj, events.NORMAL, "MissingJob", f"Active job went missing: {ref.get('name')}"
                )
                active = [r for r in active if r.get("uid") != ref.get("uid")]
        if active:
            status["active"] = active
        else:
            status.pop("active", None)

    # ------------------------------------------------------------ starting jobs

    async def _schedule(self, cj: Object, owned: list[Object]) -> float | None:
        """Start the due Job, if any; returns the seconds until the next start (None: never)."""
        spec, status = cj.get("spec") or {}, cj["status"]
        if cj["metadata"].get("deletionTimestamp"):
            return None
        zone_name = spec.get("timeZone")
        if zone_name is not None and cron.valid_time_zone(zone_name):
            await self.recorder.event(
                COMPONENT,
                cj,
                events.WARNING,
                "UnknownTimeZone",
                f'invalid timeZone: "{zone_name}": unknown time zone {zone_name}',
            )
            return None
        if spec.get("suspend"):
            return None
        try:
            schedule = cron.parse(str(spec.get("schedule") or ""))
        except cron.CronError as e:
            await self.recorder.event(
                COMPONENT,
                cj,
                events.WARNING,
                "UnparseableSchedule",
                f'unparseable schedule: "{spec.get("schedule")}" : {e}',
            )
            return None
        now = self.clock.now()
        _, scheduled, missed = most_recent_schedule(cj, now, schedule, with_deadline=True)
        if scheduled is not None and missed > MANY_MISSED:
            await self.recorder.event(
                COMPONENT,
                cj,
                events.WARNING,
                "TooManyMissedTimes",
                "too many missed start times. Set or decrease .spec.startingDeadlineSeconds "
                "or check clock skew",
            )
        if scheduled is None or scheduled > now:
            return self._next_in(cj, now, schedule)
        deadline = spec.get("startingDeadlineSeconds")
        if isinstance(deadline, int) and scheduled + datetime.timedelta(seconds=deadline) < now:
            await self.recorder.event(
                COMPONENT,
                cj,
                events.WARNING,
                "MissSchedule",
                "Missed scheduled time to start a job: "
                + scheduled.astimezone(datetime.UTC).strftime("%a, %d %b %Y %H:%M:%S +0000"),
            )
            return self._next_in(cj, now, schedule)
        name = job_name(cj, scheduled)
        active = status.get("active") or []
        if (
            any(ref.get("name") == name for ref in active)
            or _time(status.get("lastScheduleTime")) == scheduled
        ):
            return self._next_in(cj, now, schedule)
        policy = spec.get("concurrencyPolicy", "Allow")
        if policy == "Forbid" and active:
            await self.recorder.event(
                COMPONENT,
                cj,
                events.NORMAL,
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid",
            )
            return self._next_in(cj, now, schedule)
        if policy == "Replace":
            for ref in list(active):
                running = self.jobs.get(ref.get("namespace", ""), ref.get("name", ""))
                if running is not None:
                    await self._delete_job(cj, running)
        created = await self._create_job(cj, scheduled)
        if created is not None:
            meta = created["metadata"]
            reference = {
                "kind": "Job",
                "namespace": meta.get("namespace", ""),
                "name": meta["name"],
                "uid": meta.get("uid", ""),
                "apiVersion": "batch/v1",
                "resourceVersion": meta.get("resourceVersion", ""),
            }
            status["active"] = [*(status.get("active") or []), reference]
            status["lastScheduleTime"] = objects.rfc3339(scheduled.astimezone(datetime.UTC))
        return self._next_in(cj, now, schedule)

    def _next_in(self, cj: Object, now: datetime.datetime, schedule: cron.Schedule) -> float | None:
        """nextScheduleTimeDuration: seconds until the start after the most recent one."""
        earliest, recent, _ = most_recent_schedule(cj, now, schedule, with_deadline=False)
        upcoming = schedule.next(recent or earliest, _zone(cj))
        if upcoming is None:
            return None
        return (upcoming - now).total_seconds() + NEXT_SCHEDULE_DELTA

    async def _create_job(self, cj: Object, scheduled: datetime.datetime) -> Object | None:
        template = copy.deepcopy((cj.get("spec") or {}).get("jobTemplate") or {})
        template_meta = template.get("metadata") or {}
        annotations = dict(template_meta.get("annotations") or {})
        annotations[SCHEDULED_TIMESTAMP] = (
            scheduled.astimezone(_zone(cj)).isoformat(timespec="seconds").replace("+00:00", "Z")
        )
        namespace = cj["metadata"].get("namespace", "")
        body: Object = {
            "metadata": {
                "name": job_name(cj, scheduled),
                "namespace": namespace,
                "annotations": annotations,
                "ownerReferences": [podcontrol.controller_ref(cj, api_version="batch/v1", kind="CronJob")],
            },
            "spec": template.get("spec") or {},
        }
        if template_meta.get("labels"):
            body["metadata"]["labels"] = dict(template_meta["labels"])
        try:
            result = await self.store.create(
                self.jobs.kind, namespace, body, store_mod.WriteOptions(field_manager=MANAGER)
            )
        except errors.StatusError as e:
            if e.reason == "AlreadyExists":
                existing = await self.store.get(self.jobs.kind, namespace, body["metadata"]["name"])
                owner = framework.controller_of(existing) or {}
                in_active = any(
                    r.get("uid") == existing["metadata"].get("uid") for r in cj["status"].get("active") or []
                )
                return existing if owner.get("uid") == cj["metadata"]["uid"] and not in_active else None
            if any(c.get("reason") == "NamespaceTerminating" for c in (e.details or {}).get("causes") or []):
                raise
            await self.recorder.event(
                COMPONENT, cj, events.WARNING, "FailedCreate", f"Error creating job: {e.message}"
            )
            raise
        await self.recorder.event(
            COMPONENT,
            cj,
            events.NORMAL,
            "SuccessfulCreate",
            f"Created job {result.object['metadata']['name']}",
        )
        return result.object

    async def _delete_job(self, cj: Object, j: Object) -> None:
        meta = j["metadata"]
        try:
            await self.store.delete(
                self.jobs.kind,
                meta.get("namespace", ""),
                meta["name"],
                store_mod.DeleteOptions(propagation_policy="Background"),
            )
        except errors.StatusError as e:
            if e.code != 404:
                await self.recorder.event(
                    COMPONENT, cj, events.WARNING, "FailedDelete", f"Deleted job: {e.message}"
                )
                raise
        status = cj["status"]
        active = [r for r in status.get("active") or [] if r.get("uid") != meta.get("uid")]
        if active:
            status["active"] = active
        else:
            status.pop("active", None)
        await self.recorder.event(
            COMPONENT, cj, events.NORMAL, "SuccessfulDelete", f"Deleted job {meta['name']}"
        )

    # ------------------------------------------------------------ history

    async def _clean_up(self, cj: Object, owned: list[Object]) -> None:
        """cleanupFinishedJobs: keep the newest `*JobsHistoryLimit` finished Jobs of each outcome."""
        spec = cj.get("spec") or {}
        for state, field in (
            ("Complete", "successfulJobsHistoryLimit"),
            ("Failed", "failedJobsHistoryLimit"),
        ):
            limit = spec.get(field)
            if not isinstance(limit, int):
                continue
            done = [j for j in owned if _finished(j) == state and not j["metadata"].get("deletionTimestamp")]
            if len(done) <= limit:
                continue
            done.sort(key=_start_order)
            for j in done[: len(done) - limit]:
                await self._delete_job(cj, j)

    async def _write_status(self, cj: Object) -> None:
        try:
            await self.store.update(
                self.cronjobs.kind,
                cj["metadata"].get("namespace", ""),
                cj["metadata"]["name"],
                cj,
                store_mod.WriteOptions(
                    field_manager=MANAGER, subresource="status", field_validation="Ignore"
                ),
            )
        except errors.StatusError as e:
            if e.code != 404:
                raise


def _start_order(j: Object) -> tuple[int, str, str]:
    """byJobStartTime: started Jobs by start time, unstarted ones last, names breaking ties."""
    started = (j.get("status") or {}).get("startTime")
    return (0 if started else 1, str(started or ""), j["metadata"]["name"])
