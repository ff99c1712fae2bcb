"""The CronJob controller in-process with a fake clock: Jobs at each start, no catch-up after
downtime, concurrency policies, suspend, starting deadlines, history limits and time zones."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.api import cron
from socialweb_computer.apiserver import registry, store
from socialweb_computer.controllers import cronjob, framework, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock
        self.cronjobs = st.registry.lookup("batch", "v1", "cronjobs")
        self.jobs = st.registry.lookup("batch", "v1", "jobs")
        self.pods = st.registry.lookup("", "v1", "pods")
        self.events = st.registry.lookup("", "v1", "events")

    async def create(self, name: str = "cj", **spec: Any) -> None:
        body = {"metadata": {"name": name}, "spec": {
            "schedule": "*/1 * * * *",
            "jobTemplate": {"metadata": {"labels": {"from": name}}, "spec": {"template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}},
            **spec}}
        await self.store.create(self.cronjobs, "t", body, W)
        await self.mgr.settle()

    async def to_next_minute(self, minutes: int = 1) -> None:
        """Move the clock just past the next `minutes` minute boundaries, letting timers fire."""
        for _ in range(minutes):
            now = self.clock.now()
            boundary = now.replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
            self.clock.advance((boundary - now).total_seconds() + 0.5)
            await self.mgr.settle()

    async def cronjob(self, name: str = "cj") -> dict:
        return await self.store.get(self.cronjobs, "t", name)

    async def job_names(self) -> list[str]:
        return sorted(j["metadata"]["name"] for j in (await self.store.list(self.jobs, "t",
                                                                            store.ListOptions()))["items"])

    async def finish_jobs(self) -> None:
        """Let every pod of every Job succeed, so the Job controller completes them."""
        for pod in (await self.store.list(self.pods, "t", store.ListOptions()))["items"]:
            if (pod.get("status") or {}).get("phase") == "Succeeded":
                continue
            pod["status"] = {"phase": "Succeeded"}
            await self.store.update(self.pods, "t", pod["metadata"]["name"], pod,
                                    store.WriteOptions(field_manager="t", subresource="status"))
        await self.mgr.settle()

    async def reasons(self) -> list[str]:
        items = (await self.store.list(self.events, "t", store.ListOptions()))["items"]
        return [e["reason"] for e in items if e["involvedObject"]["kind"] == "CronJob"]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    # The store stamps creationTimestamp from the wall clock; the controller's clock starts there.
    clock = framework.FakeClock(datetime.datetime.now(datetime.UTC).replace(second=1, microsecond=0))
    mgr = manager.Manager(st, clock)
    await mgr.start()
    ns_kind = st.registry.lookup("", "v1", "namespaces")
    assert ns_kind is not None
    await st.create(ns_kind, "", {"metadata": {"name": "t"}}, W)
    yield Env(st, mgr, clock)
    await mgr.close()
    await backend.close()


async def test_a_job_at_each_start(env: Env) -> None:
    await env.create()
    assert await env.job_names() == []
    await env.to_next_minute()
    (name,) = await env.job_names()
    scheduled = env.clock.now().replace(second=0, microsecond=0)
    assert name == f"cj-{int(scheduled.timestamp()) // 60}"
    j = await env.store.get(env.jobs, "t", name)
    assert j["metadata"]["labels"]["from"] == "cj"
    stamp = scheduled.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert j["metadata"]["annotations"][cronjob.SCHEDULED_TIMESTAMP] == stamp
    (ref,) = j["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["controller"]) == ("CronJob", "cj", True)
    status = (await env.cronjob())["status"]
    assert [a["name"] for a in status["active"]] == [name]
    assert status["lastScheduleTime"] == scheduled.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "SuccessfulCreate" in await env.reasons()
    await env.finish_jobs()
    status = (await env.cronjob())["status"]
    assert "active" not in status and status["lastSuccessfulTime"]
    assert "SawCompletedJob" in await env.reasons()


async def test_history_limits_keep_the_newest_finished_jobs(env: Env) -> None:
    await env.create(successfulJobsHistoryLimit=2)
    for _ in range(4):
        await env.to_next_minute()
        await env.finish_jobs()
    names = await env.job_names()
    assert len(names) == 2
    newest = int(env.clock.now().replace(second=0, microsecond=0).timestamp()) // 60
    assert names == [f"cj-{newest - 1}", f"cj-{newest}"]
    assert "SuccessfulDelete" in await env.reasons()


async def test_only_the_most_recent_missed_start_runs(env: Env) -> None:
    await env.create()
    env.clock.advance(10 * 60)  # the controller was away for ten starts
    await env.mgr.settle()
    assert len(await env.job_names()) == 1


async def test_forbid_skips_while_a_job_runs_and_replace_swaps_it(env: Env) -> None:
    await env.create("forbid", concurrencyPolicy="Forbid")
    await env.create("replace", concurrencyPolicy="Replace")
    await env.to_next_minute()
    first = await env.job_names()
    await env.to_next_minute()
    names = await env.job_names()
    assert [n for n in names if n.startswith("forbid-")] == [n for n in first if n.startswith("forbid-")]
    replaced = [n for n in names if n.startswith("replace-")]
    assert len(replaced) == 1 and replaced != [n for n in first if n.startswith("replace-")]
    assert "JobAlreadyActive" in await env.reasons()


async def test_suspended_and_late_cronjobs_start_nothing(env: Env) -> None:
    await env.create("paused", suspend=True)
    await env.to_next_minute(2)
    assert await env.job_names() == []
    cj = await env.cronjob("paused")
    cj["spec"]["suspend"] = False
    await env.store.update(env.cronjobs, "t", "paused", cj, W)
    await env.mgr.settle()
    assert len(await env.job_names()) == 1  # resuming runs the most recent start once


def test_most_recent_schedule_follows_the_time_zone() -> None:
    schedule = cron.parse("0 9 * * *")
    created = datetime.datetime(2026, 3, 1, 0, 0, tzinfo=datetime.UTC)
    cj = {"metadata": {"creationTimestamp": "2026-03-01T00:00:00Z"},
          "spec": {"timeZone": "America/New_York"}, "status": {}}
    now = created + datetime.timedelta(hours=14, minutes=1)  # 14:01 UTC is 09:01 in New York
    _, recent, missed = cronjob.most_recent_schedule(cj, now, schedule, with_deadline=False)
    assert recent == datetime.datetime(2026, 3, 1, 14, 0, tzinfo=datetime.UTC) and missed == 0
    cj["spec"]["startingDeadlineSeconds"] = 30
    assert cronjob.most_recent_schedule(cj, now, schedule, with_deadline=True)[1] is None
