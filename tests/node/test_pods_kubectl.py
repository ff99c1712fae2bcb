"""Pods on a real sandbox node, driven with the real kubectl: what a kubelet does, seen from outside.

Each test has its own namespace on one shared node (see conftest.py). Images come from
a docker-registry on loopback that the tests fill themselves.
"""

from __future__ import annotations

import json
import textwrap
import time
from typing import Any

from socialweb_computer.testing import images


def _pod(name: str, image: str, command: str, **extra: Any) -> str:
    spec = {
        "restartPolicy": extra.pop("restartPolicy", "Never"),
        "containers": [{"name": "main", "image": image, "command": ["sh", "-c", command], **extra}],
    }
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def _container(pod: dict[str, Any], name: str = "") -> dict[str, Any]:
    """A container's status: `name`'s, or the only container's."""
    statuses = pod["status"].get("containerStatuses") or []
    if not name:
        return statuses[0]
    return next(c for c in statuses if c["name"] == name)


def test_a_busybox_pod_runs_prints_and_succeeds(tenant, ns, image) -> None:
    tenant.kubectl(
        "run",
        "hello",
        "-n",
        ns,
        "--image",
        image,
        "--restart=Never",
        "--",
        "sh",
        "-c",
        # stdout and stderr are copied to the log separately (as upstream): a pause keeps their order.
        "echo hello from a pod; sleep 0.2; echo to stderr >&2",
    )
    pod = tenant.wait_phase("hello", ns, ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded"
    terminated = _container(pod)["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
    assert terminated["containerID"].startswith("containerd://")
    assert pod["status"]["podIP"].startswith("10.244.")
    assert pod["status"]["qosClass"] == "BestEffort"
    logs = tenant.kubectl("logs", "hello", "-n", ns).stdout
    assert logs == "hello from a pod\nto stderr\n"
    stamped = tenant.kubectl("logs", "hello", "-n", ns, "--timestamps").stdout.splitlines()
    assert stamped[0].endswith(" hello from a pod") and stamped[0][:4].isdigit()
    table = tenant.kubectl("get", "pod", "hello", "-n", ns).stdout
    assert "Completed" in table


def test_describe_shows_the_kubelet_event_sequence(tenant, ns, image) -> None:
    tenant.kubectl(
        "run",
        "seq",
        "-n",
        ns,
        "--image",
        image,
        "--restart=Never",
        "--image-pull-policy=Always",
        "--",
        "true",
    )
    tenant.wait_phase("seq", ns, ("Succeeded",))
    reasons = [e["reason"] for e in tenant.events("seq", ns) if e["source"].get("component") == "kubelet"]
    expected = ["Pulling", "Pulled", "Created", "Started"]
    assert [r for r in reasons if r in expected] == expected, reasons
    described = tenant.kubectl("describe", "pod", "seq", "-n", ns).stdout
    assert f'Pulling image "{image}"' in described
    assert "Successfully pulled image" in described
    assert "Created container: main" in described or "Created container: seq" in described
    assert "Started container" in described


def test_a_deployment_of_three_goes_ready_with_distinct_ips(tenant, ns, image) -> None:
    tenant.kubectl(
        "create",
        "deployment",
        "web",
        "-n",
        ns,
        "--image",
        image,
        "--replicas=3",
        "--",
        "sh",
        "-c",
        "mkdir -p /w; hostname > /w/index.html; httpd -f -p 8080 -h /w",
    )
    tenant.wait(
        lambda: tenant.get("deployment", "web", ns)["status"].get("readyReplicas") == 3, "3 ready replicas"
    )
    pods = json.loads(tenant.kubectl("get", "pods", "-n", ns, "-l", "app=web", "-o", "json").stdout)["items"]
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == 3
    assert all(p["status"]["phase"] == "Running" for p in pods)
    ready = [c for p in pods for c in p["status"]["conditions"] if c["type"] == "Ready"]
    assert all(c["status"] == "True" for c in ready)


def test_two_containers_of_one_pod_talk_over_localhost(tenant, ns, image) -> None:
    manifest = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pair"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "server",
                        "image": image,
                        "command": [
                            "sh",
                            "-c",
                            "mkdir -p /w; echo hello-from-server > /w/index.html; "
                            "httpd -f -p 127.0.0.1:8080 -h /w",
                        ],
                    },
                    {
                        "name": "client",
                        "image": image,
                        "command": [
                            "sh",
                            "-c",
                            "until wget -qO- http://127.0.0.1:8080/index.html; do sleep 0.2; done",
                        ],
                    },
                ],
            },
        }
    )
    tenant.apply(manifest, ns)
    tenant.wait(lambda: "terminated" in _container(tenant.pod("pair", ns), "client")["state"], "client done")
    assert tenant.kubectl("logs", "pair", "-n", ns, "-c", "client").stdout == "hello-from-server\n"
    message = tenant.kubectl("logs", "pair", "-n", ns, check=False)
    assert message.returncode == 0  # kubectl defaults to the first container, as with any cluster


def test_a_crashing_container_reaches_crashloopbackoff_with_rising_restarts(tenant, ns, image) -> None:
    tenant.apply(_pod("crash", image, "echo boom; exit 3", restartPolicy="Always"), ns)

    def looping() -> Any:
        status = _container(tenant.pod("crash", ns))
        waiting = status["state"].get("waiting") or {}
        return waiting.get("reason") == "CrashLoopBackOff" and status["restartCount"] >= 2 and status

    status = tenant.wait(looping, "CrashLoopBackOff with 2 restarts", timeout=120)
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["reason"] == "Error"
    assert "back-off" in status["state"]["waiting"]["message"]
    assert "restarting failed container=main pod=crash_" in status["state"]["waiting"]["message"]
    table = tenant.kubectl("get", "pod", "crash", "-n", ns).stdout
    assert "CrashLoopBackOff" in table
    assert "BackOff" in {e["reason"] for e in tenant.events("crash", ns)}
    previous = tenant.kubectl("logs", "crash", "-n", ns, "--previous").stdout
    assert previous == "boom\n"


def test_a_memory_limit_ends_in_oomkilled(tenant, ns, image) -> None:
    tenant.apply(
        _pod(
            "oom",
            image,
            "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done",
            resources={"limits": {"memory": "24Mi"}},
        ),
        ns,
    )
    pod = tenant.wait_phase("oom", ns, ("Failed",), timeout=120)
    terminated = _container(pod)["state"]["terminated"]
    assert terminated["reason"] == "OOMKilled"
    assert terminated["exitCode"] == 137
    assert pod["status"]["qosClass"] == "Burstable"  # a memory limit alone: Guaranteed needs cpu too


def test_a_missing_image_shows_errimagepull_then_imagepullbackoff(tenant, ns, registry) -> None:
    missing = f"{registry.host}/test/does-not-exist:1"
    tenant.kubectl("run", "missing", "-n", ns, "--image", missing, "--restart=Never")
    seen: set[str] = set()

    def both() -> bool:
        waiting = _container(tenant.pod("missing", ns))["state"].get("waiting") or {}
        seen.add(waiting.get("reason", ""))
        return {"ErrImagePull", "ImagePullBackOff"} <= seen or ("ImagePullBackOff" in seen and waiting)

    tenant.wait(both, "ErrImagePull and ImagePullBackOff", timeout=60, interval=0.1)
    waiting = _container(tenant.pod("missing", ns))["state"]["waiting"]
    assert "not found" in waiting["message"]
    events = tenant.events("missing", ns)
    failed = [e["message"] for e in events if e["reason"] == "Failed"]
    assert any(m.startswith(f'Failed to pull image "{missing}": ') and "not found" in m for m in failed), (
        failed
    )
    assert "Error: ErrImagePull" in failed
    assert any(
        e["reason"] == "BackOff" and e["message"] == f'Back-off pulling image "{missing}"' for e in events
    )


def test_a_private_image_pulls_with_imagepullsecrets_and_fails_without(tenant, ns, private_registry) -> None:
    private = f"{private_registry.host}/private/busybox:1"
    tenant.kubectl("run", "without", "-n", ns, "--image", private, "--restart=Never", "--", "true")
    tenant.wait(
        lambda: (
            (_container(tenant.pod("without", ns))["state"].get("waiting") or {}).get("reason")
            in ("ErrImagePull", "ImagePullBackOff")
        ),
        "pull refused",
    )
    message = _container(tenant.pod("without", ns))["state"]["waiting"]["message"]
    assert "401" in message or "unauthorized" in message.lower() or "authorization" in message.lower(), (
        message
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pull"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": private_registry.dockerconfigjson()},
    }
    tenant.apply(json.dumps(secret), ns)
    pod = json.loads(_pod("with", private, "true"))
    pod["spec"]["imagePullSecrets"] = [{"name": "pull"}]
    tenant.apply(json.dumps(pod), ns)
    assert tenant.wait_phase("with", ns, ("Succeeded", "Failed"))["status"]["phase"] == "Succeeded"


def test_configmap_secret_and_downward_api_arrive_as_files_and_env(tenant, ns, image) -> None:
    tenant.kubectl(
        "create", "configmap", "cfg", "-n", ns, "--from-literal=greeting=hello", "--from-literal=color=blue"
    )
    tenant.kubectl("create", "secret", "generic", "sec", "-n", ns, "--from-literal=password=hunter2")
    script = (
        "echo GREETING=$GREETING; echo PASSWORD=$PASSWORD; echo POD=$MY_POD NS=$MY_NS IP=$MY_IP; "
        "echo COLOR=$CFG_color; echo MEM=$MEM_LIMIT; cat /cfg/greeting; echo; cat /sec/password; echo; "
        "cat /info/labels; echo; cat /info/name; echo; stat -L -c %a /sec/password"
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "files", "labels": {"app": "files"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["sh", "-c", script],
                    "resources": {"limits": {"memory": "64Mi"}},
                    "env": [
                        {
                            "name": "GREETING",
                            "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "greeting"}},
                        },
                        {
                            "name": "PASSWORD",
                            "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}},
                        },
                        {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {
                            "name": "MEM_LIMIT",
                            "valueFrom": {
                                "resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}
                            },
                        },
                    ],
                    "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "cfg"}}],
                    "volumeMounts": [
                        {"name": "cfg", "mountPath": "/cfg"},
                        {"name": "sec", "mountPath": "/sec"},
                        {"name": "info", "mountPath": "/info"},
                    ],
                }
            ],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "sec", "secret": {"secretName": "sec", "defaultMode": 0o400}},
                {
                    "name": "info",
                    "downwardAPI": {
                        "items": [
                            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                        ]
                    },
                },
            ],
        },
    }
    tenant.apply(json.dumps(pod), ns)
    done = tenant.wait_phase("files", ns, ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded"
    out = tenant.kubectl("logs", "files", "-n", ns).stdout.splitlines()
    assert out[0] == "GREETING=hello"
    assert out[1] == "PASSWORD=hunter2"
    assert out[2] == f"POD=files NS={ns} IP={done['status']['podIP']}"
    assert out[3] == "COLOR=blue"
    assert out[4] == "MEM=64"
    assert out[5:9] == ["hello", "hunter2", 'app="files"', "files"]
    assert out[9] == "400"


def test_a_missing_configmap_is_createcontainerconfigerror(tenant, ns, image) -> None:
    pod = json.loads(_pod("nocfg", image, "true"))
    pod["spec"]["containers"][0]["env"] = [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}
    ]
    tenant.apply(json.dumps(pod), ns)
    waiting = tenant.wait(
        lambda: (
            (_container(tenant.pod("nocfg", ns))["state"].get("waiting") or {}).get("reason")
            == "CreateContainerConfigError"
            and _container(tenant.pod("nocfg", ns))["state"]["waiting"]
        ),
        "CreateContainerConfigError",
    )
    assert waiting["message"] == 'configmap "absent" not found'


def test_a_readiness_probe_gates_ready_and_the_endpointslice(tenant, ns, image) -> None:
    manifest = textwrap.dedent(f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: gated, labels: {{app: gated}}}}
        spec:
          containers:
          - name: main
            image: {image}
            command: [sh, -c, 'mkdir -p /w; echo ok > /w/ready; sleep 4; httpd -f -p 8080 -h /w']
            readinessProbe:
              httpGet: {{path: /ready, port: 8080}}
              periodSeconds: 1
        ---
        apiVersion: v1
        kind: Service
        metadata: {{name: gated}}
        spec:
          selector: {{app: gated}}
          ports: [{{port: 80, targetPort: 8080}}]
        """)
    tenant.apply(manifest, ns)
    tenant.wait(lambda: "running" in _container(tenant.pod("gated", ns))["state"], "running")
    pod = tenant.pod("gated", ns)
    assert _container(pod)["ready"] is False
    ready = {c["type"]: c for c in pod["status"]["conditions"]}["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "ContainersNotReady"

    def endpoint_ready() -> Any:
        slices = json.loads(
            tenant.kubectl(
                "get", "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=gated", "-o", "json"
            ).stdout
        )["items"]
        endpoints = [e for s in slices for e in s.get("endpoints") or []]
        return endpoints and endpoints[0]

    first = tenant.wait(endpoint_ready, "an endpoint")
    assert first["conditions"]["ready"] is False
    tenant.wait(lambda: _container(tenant.pod("gated", ns))["ready"], "ready", timeout=60)
    tenant.wait(lambda: (e := endpoint_ready()) and e["conditions"]["ready"], "endpoint ready")


def test_a_liveness_probe_restarts_a_container(tenant, ns, image) -> None:
    manifest = textwrap.dedent(f"""
        apiVersion: v1
        kind: Pod
        metadata: {{name: live}}
        spec:
          containers:
          - name: main
            image: {image}
            command: [sh, -c, 'touch /tmp/alive; sleep 3; rm /tmp/alive; sleep 3600']
            livenessProbe:
              exec: {{command: [cat, /tmp/alive]}}
              periodSeconds: 1
              failureThreshold: 2
            terminationMessagePolicy: FallbackToLogsOnError
          terminationGracePeriodSeconds: 2
        """)
    tenant.apply(manifest, ns)
    tenant.wait(lambda: _container(tenant.pod("live", ns))["restartCount"] >= 1, "a restart", timeout=90)
    events = tenant.events("live", ns)
    unhealthy = [e["message"] for e in events if e["reason"] == "Unhealthy"]
    assert any(m.startswith("Liveness probe failed:") for m in unhealthy), unhealthy
    killing = [e["message"] for e in events if e["reason"] == "Killing"]
    assert "Container main failed liveness probe, will be restarted" in killing


def test_graceful_delete_delivers_sigterm_within_the_grace_period(tenant, ns, image) -> None:
    script = "trap 'echo got SIGTERM > /dev/termination-log; exit 0' TERM; while true; do sleep 0.2; done"
    tenant.apply(_pod("graceful", image, script, restartPolicy="Always"), ns)
    tenant.wait(lambda: "running" in _container(tenant.pod("graceful", ns))["state"], "running")
    uid = tenant.pod("graceful", ns)["metadata"]["uid"]
    started = time.monotonic()
    tenant.kubectl("delete", "pod", "graceful", "-n", ns, "--grace-period=20", "--wait=false")
    seen: list[dict[str, Any]] = []

    def gone() -> bool:
        result = tenant.kubectl("get", "pod", "graceful", "-n", ns, "-o", "json", check=False)
        if result.returncode != 0:
            return True
        seen.append(json.loads(result.stdout))
        return False

    tenant.wait(gone, "pod gone", timeout=25, interval=0.1)
    assert time.monotonic() - started < 20
    final = [
        p
        for p in seen
        if p["metadata"]["uid"] == uid
        and "terminated" in (_container(p)["state"] if p["status"].get("containerStatuses") else {})
    ]
    if final:  # the last status the agent posted before the object went away
        assert _container(final[-1])["state"]["terminated"]["message"].strip() == "got SIGTERM"
    killing = [e for e in tenant.events("graceful", ns) if e["reason"] == "Killing"]
    assert killing and killing[0]["message"] == "Stopping container main"


def test_a_job_runs_to_completion(tenant, ns, image) -> None:
    tenant.kubectl("create", "job", "once", "-n", ns, "--image", image, "--", "sh", "-c", "echo job done")
    tenant.wait(lambda: tenant.get("job", "once", ns)["status"].get("succeeded") == 1, "job succeeded")
    job = tenant.get("job", "once", ns)
    assert {c["type"] for c in job["status"]["conditions"]} >= {"Complete"}
    assert tenant.kubectl("logs", "job/once", "-n", ns).stdout == "job done\n"


def test_init_containers_run_in_order_and_sidecars_keep_running(tenant, ns, image) -> None:
    manifest = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "init"},
            "spec": {
                "restartPolicy": "Never",
                "volumes": [{"name": "work", "emptyDir": {}}],
                "initContainers": [
                    {
                        "name": "first",
                        "image": image,
                        "command": ["sh", "-c", "echo first >> /work/order"],
                        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                    },
                    {
                        "name": "sidecar",
                        "image": image,
                        "restartPolicy": "Always",
                        "command": ["sh", "-c", "echo sidecar >> /work/order; sleep 3600"],
                        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                    },
                    {
                        "name": "second",
                        "image": image,
                        "command": ["sh", "-c", "echo second >> /work/order"],
                        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                    },
                ],
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "command": ["sh", "-c", "cat /work/order"],
                        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
                    }
                ],
            },
        }
    )
    tenant.apply(manifest, ns)
    pod = tenant.wait_phase("init", ns, ("Succeeded", "Failed"), timeout=90)
    assert pod["status"]["phase"] == "Succeeded"
    assert tenant.kubectl("logs", "init", "-n", ns, "-c", "main").stdout == "first\nsidecar\nsecond\n"
    statuses = {s["name"]: s for s in pod["status"]["initContainerStatuses"]}
    assert statuses["first"]["state"]["terminated"]["exitCode"] == 0
    # The pod ended, so its sidecar was stopped after the main container.
    assert "terminated" in statuses["sidecar"]["state"]


def test_a_security_context_is_applied(tenant, ns, registry) -> None:
    image = f"{registry.host}/test/busybox:1"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "secure"},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000},
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": [
                        "sh",
                        "-c",
                        "id -u; id -g; id -G; touch /scratch/f && stat -c %g /scratch/f; "
                        "touch /root-fs 2>/dev/null && echo writable || echo read-only; "
                        "grep CapEff /proc/self/status",
                    ],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    tenant.apply(json.dumps(pod), ns)
    assert tenant.wait_phase("secure", ns, ("Succeeded", "Failed"))["status"]["phase"] == "Succeeded"
    out = tenant.kubectl("logs", "secure", "-n", ns).stdout.splitlines()
    assert out[0] == "1000" and out[1] == "3000"
    assert "2000" in out[2].split()
    assert out[3] == "2000"
    assert out[4] == "read-only"
    assert out[5].split()[1] == "0000000000000000"


def test_run_as_non_root_refuses_a_root_image(tenant, ns, image) -> None:
    pod = json.loads(_pod("nonroot", image, "true"))
    pod["spec"]["securityContext"] = {"runAsNonRoot": True}
    tenant.apply(json.dumps(pod), ns)
    waiting = tenant.wait(
        lambda: (
            (_container(tenant.pod("nonroot", ns))["state"].get("waiting") or {}).get("reason")
            == "CreateContainerConfigError"
            and _container(tenant.pod("nonroot", ns))["state"]["waiting"]
        ),
        "refused",
    )
    assert waiting["message"].startswith("container has runAsNonRoot and image will run as root")


def test_hostname_subdomain_host_aliases_and_resolv_conf(tenant, ns, image) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "names"},
        "spec": {
            "restartPolicy": "Never",
            "hostname": "web-0",
            "subdomain": "web",
            "hostAliases": [{"ip": "10.9.9.9", "hostnames": ["alias.example", "other.example"]}],
            "dnsPolicy": "None",
            "dnsConfig": {
                "nameservers": ["10.0.2.3"],
                "searches": ["example.test"],
                "options": [{"name": "ndots", "value": "2"}],
            },
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": ["sh", "-c", "hostname; cat /etc/hosts; cat /etc/resolv.conf"],
                }
            ],
        },
    }
    tenant.apply(json.dumps(pod), ns)
    tenant.wait_phase("names", ns, ("Succeeded",))
    out = tenant.kubectl("logs", "names", "-n", ns).stdout
    assert out.splitlines()[0] == "web-0"
    assert f"web-0.web.{ns}.svc.cluster.local\tweb-0" in out
    assert "10.9.9.9\talias.example\tother.example" in out
    assert "nameserver 10.0.2.3" in out and "search example.test" in out and "ndots:2" in out


def test_termination_message_and_fallback_to_logs(tenant, ns, image) -> None:
    tenant.apply(_pod("message", image, "echo written > /dev/termination-log; exit 0"), ns)
    pod = json.loads(_pod("fallback", image, "echo last words; exit 2"))
    pod["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    tenant.apply(json.dumps(pod), ns)
    done = tenant.wait_phase("message", ns, ("Succeeded",))
    assert _container(done)["state"]["terminated"]["message"] == "written\n"
    failed = tenant.wait_phase("fallback", ns, ("Failed",))
    assert _container(failed)["state"]["terminated"]["message"] == "last words\n"


def test_active_deadline_fails_the_pod(tenant, ns, image) -> None:
    pod = json.loads(_pod("deadline", image, "sleep 3600"))
    pod["spec"]["activeDeadlineSeconds"] = 3
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    tenant.apply(json.dumps(pod), ns)
    failed = tenant.wait_phase("deadline", ns, ("Failed",), timeout=60)
    assert failed["status"]["reason"] == "DeadlineExceeded"
    assert failed["status"]["message"] == "Pod was active on the node longer than the specified deadline"


def test_share_process_namespace(tenant, ns, image) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "shared"},
        "spec": {
            "restartPolicy": "Never",
            "shareProcessNamespace": True,
            "containers": [
                {"name": "sleeper", "image": image, "command": ["sh", "-c", "exec sleep 30"]},
                {
                    "name": "main",
                    "image": image,
                    "command": [
                        "sh",
                        "-c",
                        "sleep 1; ps | grep -c '[s]leep 30'; kill $(pidof sleep) || true",
                    ],
                },
            ],
        },
    }
    tenant.apply(json.dumps(pod), ns)
    tenant.wait(lambda: "terminated" in _container(tenant.pod("shared", ns), "main")["state"], "main done")
    assert tenant.kubectl("logs", "shared", "-n", ns, "-c", "main").stdout.splitlines()[0] == "1"


def test_an_unsupported_volume_is_a_failedmount_event(tenant, ns, image) -> None:
    pod = json.loads(_pod("nfs", image, "true"))
    pod["spec"]["volumes"] = [{"name": "share", "nfs": {"server": "10.1.1.1", "path": "/export"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "share", "mountPath": "/share"}]
    tenant.apply(json.dumps(pod), ns)
    events = tenant.wait(
        lambda: [e for e in tenant.events("nfs", ns) if e["reason"] == "FailedMount"], "FailedMount"
    )
    assert events[0]["message"].startswith(
        'MountVolume.SetUp failed for volume "share" : volume type nfs is not supported by this node'
    )
    waiting = _container(tenant.pod("nfs", ns))["state"]["waiting"]
    assert waiting["reason"] == "ContainerCreating"


def test_logs_errors_match_upstream(tenant, ns, image) -> None:
    manifest = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "multi"},
            "spec": {
                "containers": [
                    {"name": "a", "image": image, "command": ["sleep", "3600"]},
                    {"name": "b", "image": image, "command": ["sleep", "3600"]},
                ],
                "terminationGracePeriodSeconds": 1,
            },
        }
    )
    tenant.apply(manifest, ns)
    tenant.wait(
        lambda: all("running" in c["state"] for c in tenant.pod("multi", ns)["status"]["containerStatuses"]),
        "running",
    )
    raw = tenant.kubectl("get", "--raw", f"/api/v1/namespaces/{ns}/pods/multi/log", check=False)
    assert "a container name must be specified for pod multi, choose one of: [a b]" in raw.stderr
    previous = tenant.kubectl("logs", "multi", "-n", ns, "-c", "a", "--previous", check=False)
    assert 'previous terminated container "a" in pod "multi" not found' in previous.stderr
    invalid = tenant.kubectl("logs", "multi", "-n", ns, "-c", "nope", check=False)
    assert "container nope is not valid for pod multi" in invalid.stderr


def test_images_are_built_by_the_tests(registry) -> None:
    # A guard for the rule that no test pulls from the internet: every image is on our registry.
    assert images.busybox_image().blobs()[2].digest == images.busybox_image().blobs()[2].digest
    assert registry.host.startswith("127.0.0.1:")
