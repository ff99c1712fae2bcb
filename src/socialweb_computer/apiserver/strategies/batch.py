"""CronJob: upstream's defaults and validation (schedule, time zone, policies, job template).

Schedules are parsed as kube-apiserver parses them (`api.cron`, robfig/cron's standard
parser), so a bad one is refused with its message, e.g. `spec.schedule: Invalid value:
"garbage": expected exactly 5 fields, found 1: [garbage]`. The job template is held to the
Job rules (`workloads.JobStrategy`), reported under `spec.jobTemplate.spec...`.
"""

from __future__ import annotations

from socialweb_computer.api import cron, objects
from socialweb_computer.api.errors import Cause
from socialweb_computer.apiserver.strategies import base, core, workloads
from socialweb_computer.apiserver.strategies.base import Object

CONCURRENCY_POLICIES = ["Allow", "Forbid", "Replace"]
# Job names are `<cronjob>-<minutes since the epoch>` (11 characters): the CronJob name leaves room.
MAX_NAME = 52


class CronJobStrategy(base.Strategy):
    def default(self, obj: Object) -> None:
        """SetDefaults_CronJob, and the pod defaults of the template inside the job template."""
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        if not spec.get("concurrencyPolicy"):
            spec["concurrencyPolicy"] = "Allow"
        for key, value in (
            ("suspend", False),
            ("successfulJobsHistoryLimit", 3),
            ("failedJobsHistoryLimit", 1),
        ):
            if spec.get(key) is None:
                spec[key] = value
        template_spec = (((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}).get(
            "spec"
        )
        if isinstance(template_spec, dict):
            core.default_pod_spec(template_spec)

    def prepare_for_create(self, obj: Object) -> None:
        obj["status"] = {}

    def validate(self, obj: Object) -> list[Cause]:
        return self._causes(obj, allow_tz=False)

    def validate_update(self, new: Object, old: Object) -> list[Cause]:
        # A schedule that already carried TZ= may keep it (allowTZInSchedule).
        return self._causes(new, allow_tz="TZ" in str((old.get("spec") or {}).get("schedule", "")))

    def _causes(self, obj: Object, *, allow_tz: bool) -> list[Cause]:
        spec = obj.get("spec") or {}
        causes: list[Cause] = []
        name = objects.meta(obj).get("name", "")
        if len(name) > MAX_NAME:
            causes.append(base.invalid("metadata.name", name, f"must be no more than {MAX_NAME} characters"))
        schedule, zone = spec.get("schedule"), spec.get("timeZone")
        if not schedule:
            causes.append(base.required("spec.schedule"))
        elif isinstance(schedule, str):
            try:
                cron.parse(schedule)
            except cron.CronError as e:
                causes.append(base.invalid("spec.schedule", schedule, str(e)))
            if "TZ" in schedule:
                if not allow_tz:
                    causes.append(
                        base.invalid(
                            "spec.schedule",
                            schedule,
                            "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
                        )
                    )
                elif zone is not None:
                    causes.append(
                        base.invalid(
                            "spec.schedule",
                            schedule,
                            "cannot use both timeZone field and TZ or CRON_TZ in schedule",
                        )
                    )
        if isinstance(zone, str):
            problem = cron.valid_time_zone(zone)
            if problem:
                causes.append(base.invalid("spec.timeZone", zone, problem))
        policy = spec.get("concurrencyPolicy")
        if policy not in CONCURRENCY_POLICIES:
            causes.append(base.not_supported("spec.concurrencyPolicy", policy, CONCURRENCY_POLICIES))
        for field in ("startingDeadlineSeconds", "successfulJobsHistoryLimit", "failedJobsHistoryLimit"):
            value = spec.get(field)
            if isinstance(value, int) and value < 0:
                causes.append(base.invalid(f"spec.{field}", value, "must be greater than or equal to 0"))
        causes.extend(self._job_template_causes(spec, name))
        return causes

    @staticmethod
    def _job_template_causes(spec: Object, name: str) -> list[Cause]:
        template = spec.get("jobTemplate")
        if not isinstance(template, dict):
            return [base.required("spec.jobTemplate")]
        job = {"metadata": {"name": name}, "spec": template.get("spec") or {}}
        return [
            Cause(
                c.reason, c.message, "spec.jobTemplate." + c.field if c.field.startswith("spec") else c.field
            )
            for c in workloads.JobStrategy().validate(job)
            if c.field != "metadata.name"
        ]


STRATEGIES: dict[tuple[str, str], base.Strategy] = {("batch", "CronJob"): CronJobStrategy()}
