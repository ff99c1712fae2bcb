"""The Job controller's batch/v1 policies in-process with a fake clock: Indexed completion
(pod index annotation/label/env/hostname, completedIndexes), backoffLimitPerIndex and
maxFailedIndexes (failedIndexes), podFailurePolicy (FailJob / Ignore / Count / FailIndex),
successPolicy, the interval helpers, and the Job strategy's defaults and validation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from socialweb_computer.api import errors
from socialweb_computer.apiserver import registry, store
from socialweb_computer.controllers import framework, jobpolicy, manager
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")
INDEX = "batch.kubernetes.io/job-completion-index"


class Env:
    def __init__(self, st: store.Store, mgr: manager.Manager, clock: framework.FakeClock) -> None:
        self.store, self.mgr, self.clock = st, mgr, clock
        self.jobs = st.registry.lookup("batch", "v1", "jobs")
        self.pods = st.registry.lookup("", "v1", "pods")
        self.events = st.registry.lookup("", "v1", "events")

    async def pods_of(self, phase: str | None = None) -> list[dict]:
        items = (await self.store.list(self.pods, "t", store.ListOptions()))["items"]
        return [p for p in items if phase is None or (p.get("status") or {}).get("phase") == phase]

    async def running(self, index: int | None = None) -> list[dict]:
        """Pods not finished (optionally of one index), oldest first."""
        pods = [p for p in await self.pods_of() if (p.get("status") or {}).get("phase") not in (
            "Succeeded", "Failed")]
        if index is not None:
            pods = [p for p in pods if p["metadata"]["annotations"][INDEX] == str(index)]
        return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])

    async def finish(self, pod: dict, phase: str, exit_code: int | None = None,
                     conditions: list[dict] | None = None) -> None:
        pod = await self.store.get(self.pods, "t", pod["metadata"]["name"])
        pod["status"] = {"phase": phase}
        if exit_code is not None:
            pod["status"]["containerStatuses"] = [{
                "name": "main", "image": "busybox", "imageID": "", "ready": False, "restartCount": 0,
                "state": {"terminated": {"exitCode": exit_code, "reason": "Error"}}}]
        if conditions:
            pod["status"]["conditions"] = conditions
        await self.store.update(self.pods, "t", pod["metadata"]["name"], pod,
                                store.WriteOptions(field_manager="t", subresource="status"))
        await self.mgr.settle()

    async def job(self, name: str = "j") -> dict:
        return await self.store.get(self.jobs, "t", name)

    async def create(self, name: str = "j", **spec: Any) -> dict:
        body = {"metadata": {"name": name}, "spec": {
            "template": {"spec": {"restartPolicy": "Never",
                                  "containers": [{"name": "main", "image": "busybox"}]}},
            **spec}}
        created = await self.store.create(self.jobs, "t", body, W)
        await self.mgr.settle()
        return created.object

    async def event_reasons(self) -> list[str]:
        return [e["reason"] for e in (await self.store.list(self.events, "t", store.ListOptions()))["items"]]


def conditions(job: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in job["status"].get("conditions") or []}


def message(job: dict, type_: str) -> str:
    return next(c["message"] for c in job["status"]["conditions"] if c["type"] == type_)


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


# ---------------------------------------------------------------- interval helpers

@pytest.mark.parametrize(("indexes", "text"), [
    ([], ""), ([3], "3"), ([0, 1], "0,1"), ([0, 1, 2], "0-2"), ([1, 3, 4, 5, 7], "1,3-5,7"),
])
def test_indexes_round_trip(indexes: list[int], text: str) -> None:
    intervals = jobpolicy.merge([], indexes)
    assert jobpolicy.format_indexes(intervals) == text
    assert jobpolicy.parse_indexes(text, 10) == intervals
    assert jobpolicy.total(intervals) == len(indexes)


def test_parse_merges_clips_and_skips_corrupt_fragments() -> None:
    assert jobpolicy.parse_indexes("0,1,2-3,x,5-99", 8) == [(0, 3), (5, 7)]
    assert jobpolicy.merge([(0, 1)], [2, 5]) == [(0, 2), (5, 5)]
    assert jobpolicy.first_pending([(0, 1), (3, 3)], 3, 6) == [2, 4, 5]
    assert jobpolicy.first_pending([(0, 1)], 5, 3) == [2]


def test_success_policy_matching() -> None:
    policy = {"rules": [{"succeededIndexes": "0-2", "succeededCount": 2}, {"succeededCount": 4}]}
    assert jobpolicy.match_success(policy, 6, [(0, 0)]) is None
    assert jobpolicy.match_success(policy, 6, [(0, 0), (2, 2)]) == "Matched rules at index 0"
    assert jobpolicy.match_success(policy, 6, [(3, 5), (1, 1)]) == "Matched rules at index 1"


# ---------------------------------------------------------------- Indexed completion

async def test_indexed_pods_and_completed_indexes(env: Env) -> None:
    await env.create(completionMode="Indexed", completions=3, parallelism=2)
    pods = await env.running()
    assert sorted(p["metadata"]["annotations"][INDEX] for p in pods) == ["0", "1"]
    for pod in pods:
        index = pod["metadata"]["annotations"][INDEX]
        assert pod["metadata"]["labels"][INDEX] == index
        assert pod["metadata"]["generateName"] == f"j-{index}-"
        assert pod["metadata"]["name"].startswith(f"j-{index}-")
        assert pod["spec"]["hostname"] == f"j-{index}"
        (env_var,) = pod["spec"]["containers"][0]["env"]
        assert env_var["name"] == "JOB_COMPLETION_INDEX"
        assert env_var["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{INDEX}']"
    await env.finish((await env.running(1))[0], "Succeeded")
    job = await env.job()
    assert job["status"]["completedIndexes"] == "1" and job["status"]["succeeded"] == 1
    assert sorted(p["metadata"]["annotations"][INDEX] for p in await env.running()) == ["0", "2"]
    await env.finish((await env.running(0))[0], "Succeeded")
    assert (await env.job())["status"]["completedIndexes"] == "0,1"
    await env.finish((await env.running(2))[0], "Succeeded")
    job = await env.job()
    assert job["status"]["completedIndexes"] == "0-2" and job["status"]["succeeded"] == 3
    assert conditions(job)["Complete"] == ("True", "CompletionsReached")
    assert "failedIndexes" not in job["status"]


async def test_a_failed_index_is_retried_with_the_same_index(env: Env) -> None:
    await env.create(completionMode="Indexed", completions=2, parallelism=2)
    await env.finish((await env.running(1))[0], "Failed")
    assert [p["metadata"]["annotations"][INDEX] for p in await env.running(1)] == ["1"]
    assert (await env.job())["status"]["failed"] == 1


async def test_backoff_limit_per_index_and_failed_indexes(env: Env) -> None:
    created = await env.create(completionMode="Indexed", completions=3, parallelism=3, backoffLimitPerIndex=1)
    assert created["spec"]["backoffLimit"] == 2**31 - 1
    assert (await env.running(0))[0]["metadata"]["annotations"][jobpolicy.FAILURE_COUNT_KEY] == "0"
    await env.finish((await env.running(0))[0], "Failed")
    (retry,) = await env.running(0)
    assert retry["metadata"]["annotations"][jobpolicy.FAILURE_COUNT_KEY] == "1"
    assert (await env.job())["status"]["failedIndexes"] == ""
    await env.finish(retry, "Failed")
    job = await env.job()
    assert job["status"]["failedIndexes"] == "0" and not await env.running(0)
    assert "Failed" not in conditions(job)
    for index in (1, 2):
        await env.finish((await env.running(index))[0], "Succeeded")
    job = await env.job()
    assert job["status"]["completedIndexes"] == "1,2" and job["status"]["failed"] == 2
    assert conditions(job)["Failed"] == ("True", "FailedIndexes")
    assert message(job, "Failed") == "Job has failed indexes"


async def test_max_failed_indexes_fails_the_job(env: Env) -> None:
    await env.create(completionMode="Indexed", completions=4, parallelism=4, backoffLimitPerIndex=0,
                     maxFailedIndexes=0)
    await env.finish((await env.running(2))[0], "Failed")
    job = await env.job()
    assert conditions(job)["Failed"] == ("True", "MaxFailedIndexesExceeded")
    assert message(job, "Failed") == "Job has exceeded the specified maximal number of failed indexes"
    assert not await env.running()


# ---------------------------------------------------------------- podFailurePolicy

FAIL_ON_42 = {"rules": [
    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
]}


async def test_fail_job_rule(env: Env) -> None:
    await env.create(parallelism=2, completions=2, podFailurePolicy=FAIL_ON_42)
    pod = (await env.running())[0]
    await env.finish(pod, "Failed", exit_code=42)
    job = await env.job()
    assert conditions(job)["FailureTarget"] == ("True", "PodFailurePolicy")
    assert conditions(job)["Failed"] == ("True", "PodFailurePolicy")
    assert message(job, "Failed") == (f"Container main for pod t/{pod['metadata']['name']} failed with exit "
                                      "code 42 matching FailJob rule at index 0")
    assert not await env.running()
    assert "PodFailurePolicy" in await env.event_reasons()


async def test_ignore_rule_does_not_count(env: Env) -> None:
    await env.create(backoffLimit=0, podFailurePolicy=FAIL_ON_42)
    disrupted = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]
    await env.finish((await env.running())[0], "Failed", exit_code=137, conditions=disrupted)
    job = await env.job()
    assert "failed" not in job["status"] and not finished_conditions(job)
    assert len(await env.running()) == 1
    # An exit code no rule matches counts: backoffLimit 0 is exceeded.
    await env.finish((await env.running())[0], "Failed", exit_code=1)
    job = await env.job()
    assert job["status"]["failed"] == 1
    assert conditions(job)["Failed"] == ("True", "BackoffLimitExceeded")


def finished_conditions(job: dict) -> set[str]:
    return set(conditions(job)) & {"Complete", "Failed", "FailureTarget", "SuccessCriteriaMet"}


async def test_fail_index_rule(env: Env) -> None:
    policy = {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [3]}}]}
    await env.create(completionMode="Indexed", completions=2, parallelism=2, backoffLimitPerIndex=5,
                     podFailurePolicy=policy)
    await env.finish((await env.running(0))[0], "Failed", exit_code=3)
    job = await env.job()
    assert job["status"]["failedIndexes"] == "0" and not await env.running(0)
    await env.finish((await env.running(1))[0], "Succeeded")
    assert conditions(await env.job())["Failed"] == ("True", "FailedIndexes")


# ---------------------------------------------------------------- successPolicy

async def test_success_policy_completes_early(env: Env) -> None:
    await env.create(completionMode="Indexed", completions=3, parallelism=3,
                     successPolicy={"rules": [{"succeededIndexes": "0"}]})
    await env.finish((await env.running(0))[0], "Succeeded")
    job = await env.job()
    assert conditions(job)["SuccessCriteriaMet"] == ("True", "SuccessPolicy")
    assert conditions(job)["Complete"] == ("True", "SuccessPolicy")
    assert message(job, "Complete") == "Matched rules at index 0"
    assert job["status"]["completedIndexes"] == "0" and job["status"]["completionTime"]
    assert not await env.running()
    assert "Completed" in await env.event_reasons()


# ---------------------------------------------------------------- strategy

async def test_defaults_for_policies(env: Env) -> None:
    policy = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
    job = await env.create(podFailurePolicy=policy)
    assert job["spec"]["podReplacementPolicy"] == "Failed"
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"] == "True"
    job = await env.create("work", parallelism=3)
    assert "completions" not in job["spec"] and job["spec"]["backoffLimit"] == 6


@pytest.mark.parametrize(("spec", "field", "text"), [
    ({"podFailurePolicy": FAIL_ON_42, "restartPolicy": "OnFailure"}, "spec.template.spec.restartPolicy",
     'Invalid value: "OnFailure": only "Never" is supported when podFailurePolicy is specified'),
    ({"completionMode": "Indexed", "parallelism": 2}, "spec.completions",
     "Required value: when completion mode is Indexed"),
    ({"backoffLimitPerIndex": 1}, "spec.backoffLimitPerIndex",
     "Invalid value: 1: requires indexed completion mode"),
    ({"completionMode": "Indexed", "completions": 2, "backoffLimitPerIndex": 1, "maxFailedIndexes": 3},
     "spec.maxFailedIndexes", "Invalid value: 3: must be less than or equal to completions"),
    ({"successPolicy": {"rules": [{"succeededCount": 1}]}}, "spec.successPolicy",
     "Invalid value: requires indexed completion mode"),
    ({"completionMode": "Indexed", "completions": 3,
      "successPolicy": {"rules": [{"succeededIndexes": "1-5"}]}},
     "spec.successPolicy.rules[0].succeededIndexes",
     'Invalid value: "1-5": error parsing succeededIndexes: too large index: "5"'),
    ({"podFailurePolicy": {"rules": [{"action": "FailIndex",
                                      "onExitCodes": {"operator": "In", "values": [1]}}]}},
     "spec.podFailurePolicy.rules[0].action",
     'Invalid value: "FailIndex": requires the backoffLimitPerIndex to be set'),
    ({"podFailurePolicy": {"rules": [{"action": "Count", "onExitCodes": {
        "containerName": "other", "operator": "In", "values": [0, 2, 1]}}]}},
     "spec.podFailurePolicy.rules[0].onExitCodes.containerName",
     'Invalid value: "other": must be one of the container or initContainer names in the pod template'),
    ({"podFailurePolicy": {"rules": [{"action": "Count"}]}}, "spec.podFailurePolicy.rules[0]",
     "Invalid value: specifying one of OnExitCodes and OnPodConditions is required"),
])
async def test_validation(env: Env, spec: dict, field: str, text: str) -> None:
    restart = spec.pop("restartPolicy", "Never")
    body = {"metadata": {"name": "bad"}, "spec": {
        "template": {"spec": {"restartPolicy": restart,
                              "containers": [{"name": "main", "image": "busybox"}]}},
        **spec}}
    with pytest.raises(errors.StatusError) as caught:
        await env.store.create(env.jobs, "t", body, W)
    assert caught.value.code == 422
    causes = {(c.field, c.message) for c in caught.value.causes}
    assert (field, text) in causes, causes


async def test_policies_are_immutable(env: Env) -> None:
    await env.create(completionMode="Indexed", completions=2, parallelism=2)
    job = await env.job()
    job["spec"]["successPolicy"] = {"rules": [{"succeededCount": 1}]}
    with pytest.raises(errors.StatusError) as caught:
        await env.store.update(env.jobs, "t", "j", job, W)
    assert "spec.successPolicy" in {c.field for c in caught.value.causes}
    job = await env.job()
    job["spec"].update(completions=4, parallelism=4)   # elastic Indexed Job
    await env.store.update(env.jobs, "t", "j", job, W)


async def test_job_managed_by_another_controller_is_left_alone(env: Env) -> None:
    await env.create(managedBy="example.com/other")
    assert not await env.pods_of() and not (await env.job()).get("status")
