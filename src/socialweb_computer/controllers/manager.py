"""Starts and stops the controllers of one logical cluster.

`LogicalCluster.start()` creates a `Manager` over its store; every controller here reacts
to the store's write hooks through shared informers and sleeps on its work queue when
nothing changes, so an idle cluster costs no CPU. Controllers do not know about each
other: they only share caches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from socialweb_computer.apiserver import serviceips
from socialweb_computer.apiserver import store as store_mod
from socialweb_computer.controllers import (
    apiregistration,
    certificates,
    cronjob,
    daemonset,
    deployment,
    disruption,
    endpoints,
    events,
    flowcontrol,
    framework,
    gc,
    hpa,
    job,
    nodelifecycle,
    replicaset,
    scheduler,
    statefulset,
    volumes,
)

log = logging.getLogger(__name__)

# The (group, plural) a worker's (namespace, name) keys name; workers with other keys have none.
PRIMARY = {
    "replicaset-controller": ("apps", "replicasets"),
    "replication-controller": ("", "replicationcontrollers"),
    "cronjob-controller": ("batch", "cronjobs"),
    "horizontal-pod-autoscaler": ("autoscaling", "horizontalpodautoscalers"),
    "certificatesigningrequest-controller": ("certificates.k8s.io", "certificatesigningrequests"),
    "deployment-controller": ("apps", "deployments"),
    "job-controller": ("batch", "jobs"),
    "disruption-controller": ("policy", "poddisruptionbudgets"),
    "endpoints-controller": ("", "services"),
    "endpointslice-controller": ("", "services"),
    "statefulset-controller": ("apps", "statefulsets"),
    "daemonset-controller": ("apps", "daemonsets"),
    "default-scheduler": ("", "pods"),
}


class Manager:
    def __init__(self, store: store_mod.Store, clock: framework.Clock | None = None, *,
                 signer: certificates.Signer | None = None,
                 on_problems_changed: Callable[[], None] | None = None) -> None:
        self.store = store
        self.clock = clock or framework.Clock()
        # Objects stored wrongly typed that controllers skip (the tenant's Degraded condition).
        self.unusable = framework.Unusable(on_problems_changed)
        store.after_write.append(self.unusable.on_write)
        self.informers = framework.Informers(store)
        self.recorder = events.Recorder(store, self.clock)
        self.gc = gc.GarbageCollector(store, self.clock)
        self.replicasets = replicaset.ReplicaSetController(store, self.informers, self.clock, self.recorder)
        self.replicationcontrollers = replicaset.ReplicaSetController(
            store, self.informers, self.clock, self.recorder, replicaset.REPLICATION_CONTROLLER)
        self.cronjobs = cronjob.CronJobController(store, self.informers, self.clock, self.recorder)
        self.autoscalers = hpa.HorizontalPodAutoscalerController(store, self.informers, self.clock,
                                                                 self.recorder)
        # Signs kubernetes.io/kube-apiserver-client CSRs with the cluster's ClientCA (None: no signer).
        self.certificates = certificates.CertificateController(store, self.informers, self.clock, signer)
        # What the apiserver keeps for itself: its local APIServices and the bootstrap
        # priority-and-fairness configuration, with their status.
        self.apiservices = apiregistration.APIServiceController(store, self.informers, self.clock)
        self.flowcontrol = flowcontrol.FlowControlController(store, self.informers, self.clock)
        self.volumes = volumes.VolumeController(store, self.informers, self.clock, self.recorder)
        self.deployments = deployment.DeploymentController(store, self.informers, self.clock, self.recorder)
        self.jobs = job.JobController(store, self.informers, self.clock, self.recorder)
        self.statefulsets = statefulset.StatefulSetController(store, self.informers, self.clock,
                                                              self.recorder)
        self.daemonsets = daemonset.DaemonSetController(store, self.informers, self.clock, self.recorder)
        self.nodelifecycle = nodelifecycle.NodeLifecycleController(store, self.informers, self.clock,
                                                                   self.recorder)
        self.scheduler = scheduler.Scheduler(store, self.informers, self.clock, self.recorder)
        self.disruption = disruption.DisruptionController(store, self.informers, self.clock, self.recorder)
        self.endpoints = endpoints.EndpointsController(store, self.informers, self.clock)
        self.endpointslices = endpoints.EndpointSliceController(store, self.informers, self.clock)
        # Not a controller but part of what a cluster runs: ClusterIP/NodePort allocation for Services.
        self.service_ips = serviceips.Allocator(store)
        self._tasks: list[asyncio.Task[None]] = []

    def _workers(self) -> list[tuple[str, framework.WorkQueue, Any]]:
        return [
            ("garbage-collector", self.gc.queue, self.gc.sync),
            ("replicaset-controller", self.replicasets.queue, self.replicasets.sync),
            ("replication-controller", self.replicationcontrollers.queue, self.replicationcontrollers.sync),
            ("cronjob-controller", self.cronjobs.queue, self.cronjobs.sync),
            ("horizontal-pod-autoscaler", self.autoscalers.queue, self.autoscalers.sync),
            ("certificatesigningrequest-controller", self.certificates.queue, self.certificates.sync),
            ("persistentvolume-controller", self.volumes.queue, self.volumes.sync),
            ("apiservice-registration-controller", self.apiservices.queue, self.apiservices.sync),
            ("priority-and-fairness-config-controller", self.flowcontrol.queue, self.flowcontrol.sync),
            ("deployment-controller", self.deployments.queue, self.deployments.sync),
            ("job-controller", self.jobs.queue, self.jobs.sync),
            ("disruption-controller", self.disruption.queue, self.disruption.sync),
            ("endpoints-controller", self.endpoints.queue, self.endpoints.sync),
            ("endpointslice-controller", self.endpointslices.queue, self.endpointslices.sync),
            ("statefulset-controller", self.statefulsets.queue, self.statefulsets.sync),
            ("daemonset-controller", self.daemonsets.queue, self.daemonsets.sync),
            ("node-lifecycle-controller", self.nodelifecycle.queue, self.nodelifecycle.sync),
            ("default-scheduler", self.scheduler.queue, self.scheduler.sync),
        ]

    @property
    def running(self) -> bool:
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    async def start(self) -> None:
        await self.service_ips.start()
        await self.informers.start()
        await self.gc.start()
        loop = asyncio.get_running_loop()
        for name, queue, sync in self._workers():
            primary = PRIMARY.get(name)
            self._tasks.append(loop.create_task(framework.run_worker(
                name, queue, sync, self.store.budget, unusable=self.unusable,
                primary=self.informers.existing(*primary) if primary else None), name=name))

    def problems(self) -> list[str]:
        """Objects the controllers skip, stored wrongly typed by an older version."""
        return [f"controllers skip {problem}; fix or delete it" for problem in self.unusable.problems()]

    async def close(self) -> None:
        for _name, queue, _sync in self._workers():
            queue.shutdown()
        self.nodelifecycle.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    @property
    def idle(self) -> bool:
        return all(queue.idle for _n, queue, _s in self._workers())

    async def settle(self, timeout: float = 10.0) -> None:
        """Wait until every queue is empty (tests)."""
        deadline = asyncio.get_running_loop().time() + timeout
        quiet = 0
        while quiet < 3:
            await asyncio.sleep(0.01)
            busy = any(len(q) or q._processing for _n, q, _s in self._workers())
            quiet = 0 if busy else quiet + 1
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("controllers did not settle")
