"""The seed's step 4-5 proof, end to end with the real kubectl and openssl.

The operator applies step 5's YAML verbatim with the admin kubeconfig, mints a runner
certificate (CN=gitlab-runner, O=gitlab-runner) from the cluster's ClientCA, checks its
subject with openssl and the permission with `kubectl auth can-i --as --as-group`; the
runner's own kubeconfig then does its job and is refused, in the real server's words,
outside it. A certificate whose Organization disagrees with the binding's Group gets 403
on every runner verb: the "group mismatch" failure the seed warns about.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest

from socialweb_computer import testing
from socialweb_computer.testing import seed

# Step 5 as the operator page (docs/01-the-kcp-server.md) has it.
SEED_YAML = seed.runner_rbac_yaml()

PODS = "/api/v1/namespaces/gitlab-runner/pods"
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "job-1"},
    "spec": {"containers": [{"name": "build", "image": "busybox"}]},
}


@pytest.fixture(scope="module")
def seeded(auth_server: testing.ApiServerProcess) -> testing.ApiServerProcess:
    applied = auth_server.kubectl("apply", "-f", "-", input=SEED_YAML)
    assert applied.stdout.splitlines() == [
        "namespace/gitlab-runner created",
        "clusterrole.rbac.authorization.k8s.io/gitlab-runner created",
        "clusterrolebinding.rbac.authorization.k8s.io/gitlab-runner created",
    ]
    return auth_server


def _err(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    return result.stderr.strip()


def test_openssl_prints_the_seed_subject_line(seeded: testing.ApiServerProcess, kit: Any) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed: the seed's check needs it", pytrace=False)
    runner = kit.mint(seeded, "runner-subject", "gitlab-runner", ("gitlab-runner",))
    out = subprocess.run(
        [openssl, "x509", "-in", str(runner.cert_file), "-noout", "-subject"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "subject=O = gitlab-runner, CN = gitlab-runner\n"


def test_admin_can_i_as_the_runner_says_yes(seeded: testing.ApiServerProcess) -> None:
    out = seeded.kubectl(
        "auth",
        "can-i",
        "create",
        "pods",
        "--namespace",
        "gitlab-runner",
        "--as=gitlab-runner",
        "--as-group=gitlab-runner",
    )
    assert out.stdout == "yes\n"
    refused = seeded.kubectl(
        "auth",
        "can-i",
        "create",
        "pods",
        "--namespace",
        "gitlab-runner",
        "--as=gitlab-runner",
        "--as-group=wrong-group",
        check=False,
    )
    assert (refused.returncode, refused.stdout) == (1, "no\n")


def test_runner_creates_execs_lists_and_deletes_pods(seeded: testing.ApiServerProcess, kit: Any) -> None:
    runner = kit.mint(seeded, "runner", "gitlab-runner", ("gitlab-runner",))
    created = kit.kubectl_as(seeded, runner, "-n", "gitlab-runner", "run", "job-0", "--image=busybox")
    assert created.returncode == 0, created.stderr
    listed = kit.kubectl_as(seeded, runner, "-n", "gitlab-runner", "get", "pods", "-o", "name")
    assert listed.stdout == "pod/job-0\n"
    for verb in ("create", "get"):
        can = kit.kubectl_as(seeded, runner, "auth", "can-i", verb, "pods/exec", "-n", "gitlab-runner")
        assert can.stdout == "yes\n"
    client = kit.Client(seeded, runner)
    try:
        # exec is authorized (what happens next is the exec handler's business, not a 403).
        status, body = client.request("POST", f"{PODS}/job-0/exec?command=true&stdout=true")
        assert status != 403, body
        status, body = client.request("GET", f"{PODS}/job-0/log")
        assert status != 403, body
    finally:
        client.close()
    deleted = kit.kubectl_as(seeded, runner, "-n", "gitlab-runner", "delete", "pod", "job-0", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr
    whoami = kit.kubectl_as(seeded, runner, "auth", "whoami", "-o", "jsonpath={.status.userInfo.groups}")
    assert whoami.stdout == '["gitlab-runner","system:authenticated"]'


def test_runner_is_refused_outside_its_rules_in_the_real_words(
    seeded: testing.ApiServerProcess, kit: Any
) -> None:
    runner = kit.mint(seeded, "runner-refused", "gitlab-runner", ("gitlab-runner",))
    assert _err(kit.kubectl_as(seeded, runner, "get", "nodes")) == (
        'Error from server (Forbidden): nodes is forbidden: User "gitlab-runner" cannot list resource '
        '"nodes" '
        'in API group "" at the cluster scope'
    )
    assert _err(
        kit.kubectl_as(seeded, runner, "create", "clusterrole", "x", "--verb=get", "--resource=pods")
    ) == (
        "Error from server (Forbidden): clusterroles.rbac.authorization.k8s.io is forbidden: User "
        '"gitlab-runner" '
        'cannot create resource "clusterroles" in API group "rbac.authorization.k8s.io" at the cluster scope'
    )
    client = kit.Client(seeded, runner)
    try:
        status, body = client.request("GET", "/api/v1/nodes/node-1")
        assert status == 403
        assert body == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'nodes "node-1" is forbidden: User "gitlab-runner" cannot get resource "nodes" '
            'in API group "" at the cluster scope',
            "reason": "Forbidden",
            "details": {"name": "node-1", "kind": "nodes"},
            "code": 403,
        }
        status, body = client.request(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {"metadata": {"name": "x"}, "rules": []},
        )
        assert status == 403
        assert body["details"] == {"group": "rbac.authorization.k8s.io", "kind": "clusterroles"}
    finally:
        client.close()


def test_secrets_of_another_namespace_follow_the_binding_scope(
    seeded: testing.ApiServerProcess, kit: Any
) -> None:
    """The seed binds with a ClusterRoleBinding, which grants its rules in every namespace
    (as on a real cluster). Bound with a RoleBinding in gitlab-runner, the same ClusterRole
    stops at that namespace, and another namespace's secrets are refused."""
    seeded.kubectl("create", "namespace", "other-team")
    seeded.kubectl("create", "secret", "generic", "s", "-n", "other-team", "--from-literal=k=v")
    runner = kit.mint(seeded, "runner-secrets", "gitlab-runner", ("gitlab-runner",))
    everywhere = kit.kubectl_as(seeded, runner, "get", "secrets", "-n", "other-team", "-o", "name")
    assert everywhere.stdout == "secret/s\n"

    seeded.kubectl(
        "create",
        "rolebinding",
        "gitlab-runner-scoped",
        "-n",
        "gitlab-runner",
        "--clusterrole=gitlab-runner",
        "--group=gitlab-runner-scoped",
    )
    scoped = kit.mint(seeded, "runner-scoped", "gitlab-runner", ("gitlab-runner-scoped",))
    mine = kit.kubectl_as(seeded, scoped, "get", "secrets", "-n", "gitlab-runner", "-o", "name")
    assert mine.returncode == 0, mine.stderr
    assert _err(kit.kubectl_as(seeded, scoped, "get", "secrets", "-n", "other-team")) == (
        'Error from server (Forbidden): secrets is forbidden: User "gitlab-runner" cannot list resource '
        '"secrets" '
        'in API group "" in the namespace "other-team"'
    )
    assert _err(kit.kubectl_as(seeded, scoped, "get", "secret", "s", "-n", "other-team")) == (
        'Error from server (Forbidden): secrets "s" is forbidden: User "gitlab-runner" cannot get resource '
        '"secrets" in API group "" in the namespace "other-team"'
    )
    # priorityclasses are cluster-scoped: a namespaced binding cannot grant them.
    assert _err(kit.kubectl_as(seeded, scoped, "get", "priorityclasses")) == (
        'Error from server (Forbidden): priorityclasses.scheduling.k8s.io is forbidden: User "gitlab-runner" '
        'cannot list resource "priorityclasses" in API group "scheduling.k8s.io" at the cluster scope'
    )


# Every verb the seed grants on pods, as the HTTP request that carries it.
_POD_VERBS = (
    ("create", "POST", PODS, POD),
    ("list", "GET", PODS, None),
    ("watch", "GET", f"{PODS}?watch=true&timeoutSeconds=1", None),
    ("get", "GET", f"{PODS}/job-1", None),
    ("update", "PUT", f"{PODS}/job-1", POD),
    ("patch", "PATCH", f"{PODS}/job-1", {"metadata": {"labels": {"a": "b"}}}),
    ("delete", "DELETE", f"{PODS}/job-1", None),
)


def test_a_certificate_with_the_wrong_group_gets_403_on_every_runner_verb(
    seeded: testing.ApiServerProcess, kit: Any
) -> None:
    wrong = kit.mint(seeded, "runner-wrong-group", "gitlab-runner", ("wrong-group",))
    client = kit.Client(seeded, wrong)
    try:
        for verb, method, path, body in _POD_VERBS:
            headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else None
            status, reply = client.request(method, path, body, headers)
            named = ' "job-1"' if path.startswith(f"{PODS}/") else ""
            assert (status, reply["message"]) == (
                403,
                (
                    f'pods{named} is forbidden: User "gitlab-runner" cannot {verb} resource "pods" in API '
                    'group "" '
                    f'in the namespace "gitlab-runner"'
                ),
            ), (verb, reply)
        status, reply = client.request("POST", f"{PODS}/job-1/exec?command=true")
        assert (status, reply["message"]) == (
            403,
            (
                'pods "job-1" is forbidden: User "gitlab-runner" cannot create resource "pods/exec" in API '
                'group "" '
                'in the namespace "gitlab-runner"'
            ),
        )
    finally:
        client.close()
    assert _err(kit.kubectl_as(seeded, wrong, "-n", "gitlab-runner", "get", "pods")) == (
        'Error from server (Forbidden): pods is forbidden: User "gitlab-runner" cannot list resource "pods" '
        'in API group "" in the namespace "gitlab-runner"'
    )
    can = kit.kubectl_as(seeded, wrong, "auth", "can-i", "create", "pods", "-n", "gitlab-runner")
    assert can.stdout == "no\n"
