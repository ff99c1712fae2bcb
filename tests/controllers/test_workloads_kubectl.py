"""CronJobs, helm's default chart with ingress and autoscaling, and volume claims, driven
with the real kubectl and helm against a server with fake nodes (kubelets without
containers: testing.fakenodes) so that pods run and Jobs finish.

The CronJob test waits for a real `*/1` start, so it takes up to a minute.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from socialweb_computer import testing
from socialweb_computer.testing import fakenodes

CRONJOB = """\
apiVersion: batch/v1
kind: CronJob
metadata: {name: tick}
spec:
  schedule: "*/1 * * * *"
  successfulJobsHistoryLimit: 1
  jobTemplate:
    spec:
      template:
        metadata:
          annotations: {fakenodes.socialweb.computer/succeed-after: "1s"}
        spec:
          restartPolicy: Never
          containers: [{name: c, image: busybox}]
"""


def _wait(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if callable(condition) and condition():
                return
        except (subprocess.CalledProcessError, KeyError, IndexError, TypeError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def _jobs(k: object, namespace: str) -> list[dict]:
    return json.loads(k("get", "-n", namespace, "jobs", "-o", "json").stdout)["items"]  # type: ignore[operator]


def test_a_cronjob_starts_jobs_and_keeps_its_history(apiserver: testing.ApiServerProcess) -> None:
    k = apiserver.kubectl
    ns = "cron"
    k("create", "namespace", ns)
    with fakenodes.ThreadedFakeNodes(apiserver.kubeconfig, 1, prefix="cron-"):
        k("apply", "-n", ns, "-f", "-", input=CRONJOB)
        cj = json.loads(k("get", "-n", ns, "cronjob", "tick", "-o", "json").stdout)
        assert (
            cj["spec"]["concurrencyPolicy"],
            cj["spec"]["suspend"],
            cj["spec"]["failedJobsHistoryLimit"],
        ) == ("Allow", False, 1)
        assert cj["status"] == {}
        # Two Jobs made by hand from the template finish; the history limit keeps one.
        for name in ("manual-1", "manual-2"):
            k("create", "job", name, "-n", ns, "--from=cronjob/tick")
            _wait(
                lambda name=name: any(
                    c["type"] == "Complete"
                    for c in json.loads(k("get", "-n", ns, "job", name, "-o", "json").stdout)["status"].get(
                        "conditions"
                    )
                    or []
                ),
                f"{name} to complete",
            )
        _wait(lambda: [j["metadata"]["name"] for j in _jobs(k, ns)] == ["manual-2"], "the history limit")
        # The schedule starts its own Job at the next minute.
        _wait(
            lambda: any(j["metadata"]["name"].startswith("tick-") for j in _jobs(k, ns)),
            "the scheduled Job",
            timeout=75,
        )
        started = next(j for j in _jobs(k, ns) if j["metadata"]["name"].startswith("tick-"))
        assert started["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
        _wait(
            lambda: json.loads(k("get", "-n", ns, "cronjob", "tick", "-o", "json").stdout)["status"].get(
                "lastSuccessfulTime"
            ),
            "the scheduled Job to succeed",
        )
        row = k("get", "-n", ns, "cronjob", "tick").stdout.splitlines()
        assert row[0].split()[:6] == ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST"]
        assert "<none>" not in row[1].split()[5]  # LAST SCHEDULE is set
        events = k("get", "-n", ns, "events", "--field-selector", "involvedObject.name=tick").stdout
        assert "SuccessfulCreate" in events and "SuccessfulDelete" in events


def test_helm_default_chart_with_ingress_and_autoscaling(
    apiserver: testing.ApiServerProcess, tmp_path: Path
) -> None:
    with fakenodes.ThreadedFakeNodes(apiserver.kubeconfig, 1, prefix="helm-"):
        apiserver.helm("create", str(tmp_path / "demo"))
        out = apiserver.helm(
            "install",
            "demo",
            str(tmp_path / "demo"),
            "--set",
            "ingress.enabled=true",
            "--set",
            "autoscaling.enabled=true",
            "--wait",
            "--timeout",
            "60s",
        ).stdout
        assert "STATUS: deployed" in out
        k = apiserver.kubectl
        assert k("get", "ingress", "demo", "-o", "name").stdout.strip() == "ingress.networking.k8s.io/demo"
        hpa = json.loads(k("get", "hpa", "demo", "-o", "json").stdout)
        assert hpa["spec"]["minReplicas"] == 1 and hpa["spec"]["maxReplicas"] == 100
        status = apiserver.helm("status", "demo").stdout
        assert "STATUS: deployed" in status
        pods = status.split("v1/Pod(related)")[1].split("==>")[0]  # the table kubectl could not decode before
        assert "Running" in pods and "1/1" in pods and "<unknown>" not in pods


def test_claims_bind_to_volumes(apiserver: testing.ApiServerProcess) -> None:
    k = apiserver.kubectl
    k(
        "apply",
        "-f",
        "-",
        input="""\
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-small}
spec:
  capacity: {storage: 2Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /data/small}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  storageClassName: ""
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
""",
    )
    _wait(
        lambda: json.loads(k("get", "pvc", "data", "-o", "json").stdout)["status"]["phase"] == "Bound",
        "the claim to bind",
    )
    pv_row = k("get", "pv", "pv-small").stdout.splitlines()[1].split()
    assert pv_row[:6] == ["pv-small", "2Gi", "RWO", "Retain", "Bound", "default/data"]
    pvc_row = k("get", "pvc", "data").stdout.splitlines()[1].split()
    assert pvc_row[:5] == ["data", "Bound", "pv-small", "2Gi", "RWO"]
    k("delete", "pvc", "data")
    _wait(
        lambda: json.loads(k("get", "pv", "pv-small", "-o", "json").stdout)["status"]["phase"] == "Released",
        "the volume to be released",
    )
