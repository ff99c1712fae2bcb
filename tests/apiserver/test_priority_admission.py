"""The Priority admission plugin: priorities resolved from PriorityClasses, upstream's 403
refusals (through kubectl and the Python client), the system classes, one globalDefault, and
GitLab Runner's value -1 pause class.

Tests that would add a globalDefault class run in-process: on the shared server it would
change every other test's pods.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator

import pytest
from kubernetes import client

from socialweb_computer import testing
from socialweb_computer.api import errors
from socialweb_computer.apiserver import registry, store
from socialweb_computer.apiserver.admission import priority
from socialweb_computer.storage import memory

W = store.WriteOptions(field_manager="test")
POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  {extra}
  containers:
    - name: c
      image: busybox
"""


class Env:
    def __init__(self, st: store.Store, plugin: priority.PriorityAdmission) -> None:
        self.store, self.plugin = st, plugin
        self.pods = st.registry.lookup("", "v1", "pods")
        self.classes = st.registry.lookup("scheduling.k8s.io", "v1", "priorityclasses")

    async def pod(self, name: str = "", **spec: object) -> dict:
        meta = {"name": name} if name else {"generateName": "gen-"}
        body = {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}
        return (await self.store.create(self.pods, "t", body, W)).object

    async def priority_class(self, name: str, value: int, **fields: object) -> dict:
        body = {"metadata": {"name": name}, "value": value, **fields}
        return (await self.store.create(self.classes, "", body, W)).object


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    backend = await memory.MemoryBackend.open()
    st = store.Store("c", backend, registry.Registry())
    plugin = priority.PriorityAdmission(st)
    await plugin.start()
    await st.create(st.registry.lookup("", "v1", "namespaces"), "", {"metadata": {"name": "t"}}, W)
    yield Env(st, plugin)
    await backend.close()


async def test_system_classes_exist_and_resolve(env: Env) -> None:
    listed = (await env.store.list(env.classes, "", store.ListOptions()))["items"]
    assert {c["metadata"]["name"]: (c["value"], c["preemptionPolicy"], c.get("globalDefault", False))
            for c in listed} == {"system-cluster-critical": (2000000000, "PreemptLowerPriority", False),
                                 "system-node-critical": (2000001000, "PreemptLowerPriority", False)}
    pod = await env.pod("dns", priorityClassName="system-cluster-critical")
    assert (pod["spec"]["priority"], pod["spec"]["preemptionPolicy"]) == (2000000000, "PreemptLowerPriority")
    plain = await env.pod("plain")
    assert (plain["spec"]["priority"], plain["spec"]["preemptionPolicy"]) == (0, "PreemptLowerPriority")
    assert "priorityClassName" not in plain["spec"]
    await priority.PriorityAdmission(env.store).start()  # a restart does not recreate them


async def test_refusals_use_upstream_wording(env: Env) -> None:
    with pytest.raises(errors.StatusError) as caught:
        await env.pod("x", priorityClassName="foo")
    assert caught.value.code == 403 and caught.value.reason == "Forbidden"
    assert caught.value.message == 'pods "x" is forbidden: no PriorityClass with name foo was found'
    with pytest.raises(errors.StatusError) as caught:
        await env.pod(priorityClassName="foo")  # named by generateName before a name exists
    assert caught.value.message == 'pods "gen-" is forbidden: no PriorityClass with name foo was found'
    await env.priority_class("high", 1000, preemptionPolicy="Never")
    with pytest.raises(errors.StatusError) as caught:
        await env.pod("y", priorityClassName="high", priority=5)
    assert caught.value.message == (
        'pods "y" is forbidden: the integer value of priority (5) must not be provided in pod spec; '
        "priority admission controller computed 1000 from the given PriorityClass name")
    with pytest.raises(errors.StatusError) as caught:
        await env.pod("z", priorityClassName="high", preemptionPolicy="PreemptLowerPriority")
    assert caught.value.message == (
        'pods "z" is forbidden: the string value of PreemptionPolicy (PreemptLowerPriority) must not be '
        "provided in pod spec; priority admission controller computed Never from the given "
        "PriorityClass name")
    ok = await env.pod("same", priorityClassName="high", priority=1000)
    assert (ok["spec"]["priority"], ok["spec"]["preemptionPolicy"]) == (1000, "Never")


async def test_one_global_default_which_unnamed_pods_get(env: Env) -> None:
    await env.priority_class("low", 10, globalDefault=True, preemptionPolicy="Never")
    with pytest.raises(errors.StatusError) as caught:
        await env.priority_class("second", 20, globalDefault=True)
    assert caught.value.code == 403
    assert caught.value.message == (
        'priorityclasses.scheduling.k8s.io "second" is forbidden: PriorityClass low is already marked as '
        "default. Only one default can exist")
    other = await env.priority_class("other", 30)
    other["globalDefault"] = True
    with pytest.raises(errors.StatusError):
        await env.store.update(env.classes, "", "other", other, W)
    low = await env.store.get(env.classes, "", "low")
    low["description"] = "still the default"
    await env.store.update(env.classes, "", "low", low, W)  # the default itself may be updated
    pod = await env.pod("p")
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"], pod["spec"]["preemptionPolicy"]) == (
        "low", 10, "Never")
    await env.store.delete(env.classes, "", "low", store.DeleteOptions())
    assert (await env.pod("q"))["spec"]["priority"] == 0


async def test_priority_survives_an_update_that_omits_it(env: Env) -> None:
    await env.priority_class("pause", -1)
    pod = await env.pod("p", priorityClassName="pause")
    assert pod["spec"]["priority"] == -1
    pod["spec"].pop("priority")
    pod["spec"].pop("preemptionPolicy")
    pod["metadata"]["labels"] = {"a": "b"}
    updated = (await env.store.update(env.pods, "t", "p", pod, W)).object
    assert (updated["spec"]["priority"], updated["spec"]["preemptionPolicy"]) == (-1, "PreemptLowerPriority")


# ---------------------------------------------------------------- through kubectl and the client


def test_kubectl_sees_priorities_and_refusals(shared_apiserver: testing.ApiServerProcess,
                                              namespace: str) -> None:
    k = shared_apiserver.kubectl
    pause = f"pause-{uuid.uuid4().hex[:6]}"
    k("create", "priorityclass", pause, "--value=-1", "--description=GitLab Runner pause pods")
    try:
        k("apply", "-n", namespace, "-f", "-",
          input=POD.format(name="p", extra=f"priorityClassName: {pause}"))
        pod = json.loads(k("get", "pod", "p", "-n", namespace, "-o", "json").stdout)
        assert (pod["spec"]["priority"], pod["spec"]["preemptionPolicy"]) == (-1, "PreemptLowerPriority")
        described = k("describe", "pod", "p", "-n", namespace).stdout
        assert re.search(rf"^Priority Class Name:\s+{pause}$", described, re.M)
        assert re.search(r"^Priority:\s+-1$", described, re.M)
        refused = k("apply", "-n", namespace, "-f", "-", check=False,
                    input=POD.format(name="x", extra="priorityClassName: foo"))
        assert refused.returncode != 0
        assert 'pods "x" is forbidden: no PriorityClass with name foo was found' in refused.stderr
        assert "Error from server (Forbidden)" in refused.stderr
        out = k("get", "priorityclasses").stdout
        assert "system-cluster-critical" in out and "2000001000" in out and pause in out
    finally:
        k("delete", "priorityclass", pause, "--ignore-not-found")


def test_python_client_gets_a_403_status(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    with shared_apiserver.python_client() as api:
        core = client.CoreV1Api(api)
        body = {"metadata": {"name": "y"},
                "spec": {"priority": 7, "containers": [{"name": "c", "image": "i"}]}}
        with pytest.raises(client.ApiException) as caught:
            core.create_namespaced_pod(namespace, body)
    assert caught.value.status == 403
    status = json.loads(caught.value.body)
    assert status["reason"] == "Forbidden" and status["details"] == {"name": "y", "kind": "pods"}
    assert status["message"] == (
        'pods "y" is forbidden: the integer value of priority (7) must not be provided in pod spec; '
        "priority admission controller computed 0 from the given PriorityClass name")
