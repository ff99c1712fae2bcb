"""The Job controller in-process with a fake clock: completions and parallelism, backoff
limit, active deadline, suspend/resume and ttlSecondsAfterFinished."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.apiserver import registry, store
from socialweb_computer.controllers import framework, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock
        self.jobs = st.registry.lookup("batch", "v1", "jobs")
        self.pods = st.registry.lookup("", "v1", "pods")

    async def pods_of(self, phase: str | None = None) -> list[dict]:
        items = (await self.store.list(self.pods, "t", store.ListOptions()))["items"]
        return [p for p in items if phase is None or (p.get("status") or {}).get("phase") == phase]

    async def finish(self, pod: dict, phase: str) -> None:
        pod = await self.store.get(self.pods, "t", pod["metadata"]["name"])
        pod["status"] = {"phase": phase}
        await self.store.update(self.pods, "t", pod["metadata"]["name"], pod,
                                store.WriteOptions(field_manager="t", subresource="status"))
        await self.mgr.settle()

    async def job(self, name: str = "j") -> dict:
        return await self.store.get(self.jobs, "t", name)

    async def create(self, name: str = "j", **spec: Any) -> None:
        body = {"metadata": {"name": name}, "spec": {
            "template": {"spec": {"restartPolicy": "Never",
                                  "containers": [{"name": "c", "image": "busybox"}]}},
            **spec}}
        await self.store.create(self.jobs, "t", body, W)
        await self.mgr.settle()


def conditions(job: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in job["status"].get("conditions") or []}


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    clock = framework.FakeClock()
    mgr = manager.Manager(st, clock)
    await mgr.start()
    ns_kind = st.registry.lookup("", "v1", "namespaces")
    assert ns_kind is not None
    await st.create(ns_kind, "", {"metadata": {"name": "t"}}, W)
    yield Env(st, mgr, clock)
    await mgr.close()
    await backend.close()


async def test_completions_with_parallelism(env: Env) -> None:
    await env.create(completions=3, parallelism=2)
    assert len(await env.pods_of()) == 2
    assert (await env.job())["status"]["active"] == 2
    for _ in range(3):
        running = [p for p in await env.pods_of() if (p.get("status") or {}).get("phase") != "Succeeded"]
        await env.finish(running[0], "Succeeded")
    job = await env.job()
    assert job["status"]["succeeded"] == 3 and "active" not in job["status"]
    assert conditions(job) == {"SuccessCriteriaMet": ("True", "CompletionsReached"),
                               "Complete": ("True", "CompletionsReached")}
    assert job["status"]["completionTime"] and job["status"]["startTime"]
    assert len(await env.pods_of()) == 3


async def test_backoff_limit_fails_the_job(env: Env) -> None:
    await env.create(backoffLimit=1)
    for _ in range(2):
        pending = [p for p in await env.pods_of() if (p.get("status") or {}).get("phase") != "Failed"]
        await env.finish(pending[0], "Failed")
    job = await env.job()
    assert job["status"]["failed"] == 2
    assert conditions(job)["Failed"] == ("True", "BackoffLimitExceeded")
    assert not [p for p in await env.pods_of() if (p.get("status") or {}).get("phase") != "Failed"]


async def test_active_deadline_uses_a_timer(env: Env) -> None:
    await env.create(activeDeadlineSeconds=30)
    assert env.clock.pending_timers == 1
    env.clock.advance(31)
    await env.mgr.settle()
    job = await env.job()
    assert conditions(job)["Failed"] == ("True", "DeadlineExceeded")
    assert not await env.pods_of()


async def test_suspend_and_resume(env: Env) -> None:
    await env.create(suspend=True, parallelism=2, completions=2)
    job = await env.job()
    assert not await env.pods_of()
    assert conditions(job) == {"Suspended": ("True", "JobSuspended")}
    assert "startTime" not in job["status"]
    job["spec"]["suspend"] = False
    await env.store.update(env.jobs, "t", "j", job, W)
    await env.mgr.settle()
    job = await env.job()
    assert conditions(job) == {"Suspended": ("False", "JobResumed")}
    assert len(await env.pods_of()) == 2 and job["status"]["startTime"]
    job["spec"]["suspend"] = True
    await env.store.update(env.jobs, "t", "j", job, W)
    await env.mgr.settle()
    assert not await env.pods_of()


async def test_ttl_after_finished_deletes_job_and_pods(env: Env) -> None:
    await env.create(ttlSecondsAfterFinished=60)
    await env.finish((await env.pods_of())[0], "Succeeded")
    assert conditions(await env.job())["Complete"][0] == "True"
    env.clock.advance(61)
    await env.mgr.settle()
    assert not (await env.store.list(env.jobs, "t", store.ListOptions()))["items"]
    assert not await env.pods_of()
