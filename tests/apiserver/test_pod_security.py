"""PodSecurity through real kubectl: enforce refuses, warn warns, labels are checked, and the
checks say exactly what upstream's say. The pure checks are also run against upstream-shaped
pods without a server."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from socialweb_computer import testing
from socialweb_computer.api import errors
from socialweb_computer.apiserver import admission, registry
from socialweb_computer.apiserver.admission import podchecks, podsecurity

PSA = "pod-security.kubernetes.io"


def _label(server: testing.ApiServerProcess, namespace: str, *labels: str) -> Any:
    return server.kubectl("label", "namespace", namespace, "--overwrite", *labels, check=False)


def _apply(server: testing.ApiServerProcess, obj: dict[str, Any]) -> Any:
    return server.kubectl("apply", "-f", "-", input=json.dumps(obj), check=False)


def _pod(name: str, namespace: str, container: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox", **(container or {})}], **spec},
    }


RESTRICTED_OK = {
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
}


def test_restricted_namespace_refuses_a_privileged_pod(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    assert _label(shared_apiserver, namespace, f"{PSA}/enforce=restricted").returncode == 0
    result = _apply(shared_apiserver, _pod("priv", namespace, {"securityContext": {"privileged": True}}))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "priv" is forbidden: violates '
        'PodSecurity "restricted:latest": privileged (container "c" must not set '
        "securityContext.privileged=true), "
        'allowPrivilegeEscalation != false (container "c" must set '
        "securityContext.allowPrivilegeEscalation=false), "
        'unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to '
        '"RuntimeDefault" '
        'or "Localhost")'
    )
    dry = shared_apiserver.kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        check=False,
        input=json.dumps(_pod("priv", namespace, {"securityContext": {"privileged": True}})),
    )
    assert dry.returncode == 1 and "violates PodSecurity" in dry.stderr
    ok = _apply(shared_apiserver, _pod("fine", namespace, RESTRICTED_OK))
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr == ""


def test_warn_baseline_warns_and_admits(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    assert _label(shared_apiserver, namespace, f"{PSA}/warn=baseline").returncode == 0
    result = _apply(
        shared_apiserver,
        _pod("hosty", namespace, {"ports": [{"containerPort": 80, "hostPort": 8080}]}, hostNetwork=True),
    )
    assert result.returncode == 0
    assert result.stderr.strip() == (
        'Warning: would violate PodSecurity "baseline:latest": host namespaces (hostNetwork=true), '
        'hostPort (container "c" uses hostPort 8080)'
    )
    assert shared_apiserver.kubectl("get", "pod", "hosty", "-n", namespace).returncode == 0


def test_audit_records_in_the_server_log_and_neither_warns_nor_refuses(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    # This server has no audit log: what upstream puts in the audit event's
    # pod-security.kubernetes.io/audit-violations annotation goes to the server log.
    assert _label(shared_apiserver, namespace, f"{PSA}/audit=baseline").returncode == 0
    result = _apply(shared_apiserver, _pod("audited", namespace, hostIPC=True))
    assert result.returncode == 0 and result.stderr == ""
    expected = (
        f'PodSecurity audit: pods {namespace}/audited would violate PodSecurity "baseline:latest": '
        "host namespaces (hostIPC=true)"
    )
    deadline = time.monotonic() + 10
    while expected not in shared_apiserver.logs(limit=1_000_000):
        assert time.monotonic() < deadline, shared_apiserver.logs()
        time.sleep(0.1)


def test_enforce_baseline_with_warn_restricted(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    _label(
        shared_apiserver,
        namespace,
        f"{PSA}/enforce=baseline",
        f"{PSA}/warn=restricted",
        f"{PSA}/warn-version=v1.30",
    )
    result = _apply(shared_apiserver, _pod("plain", namespace))
    assert result.returncode == 0
    assert result.stderr.strip().startswith(
        'Warning: would violate PodSecurity "restricted:v1.30": allowPrivilegeEscalation != false'
    )
    refused = _apply(
        shared_apiserver, _pod("volumes", namespace, volumes=[{"name": "h", "hostPath": {"path": "/"}}])
    )
    assert 'violates PodSecurity "baseline:latest": hostPath volumes (volume "h")' in refused.stderr


def test_workloads_warn_but_are_not_refused(
    shared_apiserver: testing.ApiServerProcess, namespace: str
) -> None:
    _label(shared_apiserver, namespace, f"{PSA}/enforce=baseline")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"hostPID": True, "containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }
    result = _apply(shared_apiserver, deployment)
    assert result.returncode == 0
    assert (
        result.stderr.strip()
        == 'Warning: would violate PodSecurity "baseline:latest": host namespaces (hostPID=true)'
    )


def test_bad_labels_and_relabel_warnings(shared_apiserver: testing.ApiServerProcess, namespace: str) -> None:
    bad = _label(shared_apiserver, namespace, f"{PSA}/enforce=strict")
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        f'The Namespace "{namespace}" is invalid: metadata.labels[{PSA}/enforce]: '
        'Invalid value: "strict": must be one of privileged, baseline, restricted'
    )
    bad_version = _label(shared_apiserver, namespace, f"{PSA}/enforce-version=1.30")
    assert 'Invalid value: "1.30": must be "latest" or "v1.x"' in bad_version.stderr
    _apply(shared_apiserver, _pod("old-a", namespace, {"securityContext": {"privileged": True}}))
    _apply(shared_apiserver, _pod("old-b", namespace, {"securityContext": {"privileged": True}}))
    relabel = _label(shared_apiserver, namespace, f"{PSA}/enforce=baseline")
    assert relabel.returncode == 0
    assert relabel.stderr.strip().splitlines() == [
        f'Warning: existing pods in namespace "{namespace}" violate the new PodSecurity enforce level '
        '"baseline:latest"',
        "Warning: old-a (and 1 other pod): privileged",
    ]


# ---------------------------------------------------------------- the checks themselves


def _failures(
    level: str,
    spec: dict[str, Any],
    meta: dict[str, Any] | None = None,
    version: tuple[int, int] = podchecks.LATEST,
) -> str:
    return podchecks.forbidden_detail(podchecks.evaluate(level, version, meta or {}, spec))


def test_baseline_checks_in_upstream_words() -> None:
    spec = {
        "hostIPC": True,
        "securityContext": {
            "sysctls": [{"name": "kernel.msgmax"}],
            "seLinuxOptions": {"type": "spc_t", "user": "u"},
        },
        "volumes": [{"name": "a", "hostPath": {}}, {"name": "b", "hostPath": {}}],
        "containers": [
            {
                "name": "x",
                "securityContext": {
                    "capabilities": {"add": ["SYS_ADMIN", "NET_RAW"]},
                    "procMount": "Unmasked",
                    "seccompProfile": {"type": "Unconfined"},
                    "appArmorProfile": {"type": "Unconfined"},
                },
                "livenessProbe": {"httpGet": {"host": "evil", "port": 80}},
            }
        ],
    }
    assert _failures("baseline", spec) == (
        'forbidden AppArmor profile (container "x" must not set AppArmor profile type to "Unconfined"), '
        'non-default capabilities (container "x" must not include "NET_RAW", "SYS_ADMIN" in '
        "securityContext.capabilities.add), host namespaces (hostIPC=true), "
        'hostPath volumes (volumes "a", "b"), probe or lifecycle host (container "x" uses probe or '
        "lifecycle host "
        '"evil"), procMount (container "x" must not set securityContext.procMount to "Unmasked"), '
        'seLinuxOptions (pod set forbidden securityContext.seLinuxOptions: type "spc_t"; user may not '
        "be set), "
        'seccompProfile (container "x" must not set securityContext.seccompProfile.type to "Unconfined"), '
        "forbidden sysctls (kernel.msgmax)"
    )
    # Before v1.34 there was no probe-host check; before v1.19 seccomp was annotations only.
    assert "probe or lifecycle host" not in _failures("baseline", spec, version=(1, 33))
    assert "seccompProfile" not in _failures("baseline", spec, version=(1, 18))


def test_restricted_checks_override_their_baseline_twins() -> None:
    spec = {
        "volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 0,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "x",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
                },
            }
        ],
    }
    assert _failures("restricted", spec) == (
        'unrestricted capabilities (container "x" must not include "CHOWN" in '
        "securityContext.capabilities.add), "
        'restricted volume types (volume "n" uses restricted volume type "nfs"), '
        "runAsUser=0 (pod must not set runAsUser=0)"
    )
    assert _failures("baseline", spec) == ""
    # A user-namespaced pod may run as root from v1.35 on.
    assert "runAsUser" not in _failures("restricted", {**spec, "hostUsers": False})
    assert "runAsUser" in _failures("restricted", {**spec, "hostUsers": False}, version=(1, 34))


def test_policy_from_labels_defaults_warn_to_enforce() -> None:
    policy, causes = podsecurity.policy_for(
        {f"{PSA}/enforce": "baseline", f"{PSA}/enforce-version": "v1.29"}, podsecurity.Policy()
    )
    assert not causes
    assert (str(policy.enforce), str(policy.warn), str(policy.audit)) == (
        "baseline:v1.29",
        "baseline:v1.29",
        "privileged:latest",
    )
    defaults = podsecurity.Policy(enforce=podsecurity.LevelVersion("restricted"))
    policy, _ = podsecurity.policy_for({}, defaults)
    assert str(policy.enforce) == "restricted:latest"


class _Namespaces:
    """Just enough of a Store for PodSecurity's namespace lookup."""

    def __init__(self) -> None:
        self.registry = registry.Registry()

    async def get(self, kind: Any, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {f"{PSA}/enforce": "baseline"}}}


async def test_exempt_usernames_runtime_classes_and_namespaces_skip_every_check() -> None:
    config = podsecurity.Config(
        exempt_usernames=("ops-admin",), exempt_runtime_classes=("kata",), exempt_namespaces=("infra",)
    )
    user: list[str | None] = ["alice"]
    plugin = podsecurity.PodSecurity(_Namespaces(), config, lambda: user[0])
    pods = registry.Registry().lookup("", "v1", "pods")

    async def create(namespace: str, **spec: Any) -> None:
        pod = _pod("priv", namespace, {"securityContext": {"privileged": True}}, **spec)
        request = admission.Request(pods, admission.CREATE, namespace, "priv", pod, username=user[0])
        await plugin.validate(request)

    with pytest.raises(errors.StatusError) as refused:
        await create("apps")
    assert refused.value.message == (
        'pods "priv" is forbidden: violates PodSecurity "baseline:latest": privileged '
        '(container "c" must not set securityContext.privileged=true)'
    )
    await create("apps", runtimeClassName="kata")
    await create("infra")
    user[0] = "ops-admin"
    await create("apps")
