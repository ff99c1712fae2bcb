"""A generated RBAC matrix: random Roles, ClusterRoles and bindings (seeded, so a failure
reproduces), then every combination of identity x verb x resource/subresource x namespace x
name asked of the server, compared with an evaluation of the applied rules written here
from the Kubernetes documentation, independently of the server's authorizer.

The bulk goes through SelfSubjectAccessReview POSTs with the impersonation headers kubectl
sends for `--as/--as-group` (thousands of checks in seconds); a random sample goes through
the real `kubectl auth can-i`, and another through real GET/LIST requests, so the answer
of the review, of kubectl and of enforcement are the same answer.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

import pytest

from socialweb_computer import testing

SEED = 20261129
RBAC = "rbac.authorization.k8s.io"
NAMESPACES = ("team-a", "team-b", "team-c")
USERS = ("ana", "ben", "cy", "system:serviceaccount:team-a:builder")
GROUPS = ("devs", "ops", "ci", "auditors")
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
NAMES = ("", "alpha")


@dataclass(frozen=True)
class Resource:
    group: str
    resource: str
    subresource: str = ""
    namespaced: bool = True

    @property
    def rule_form(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    @property
    def kubectl_form(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def path(self) -> str:
        return f"/apis/{self.group}/v1" if self.group else "/api/v1"


RESOURCES = (
    Resource("", "pods"),
    Resource("", "pods", "exec"),
    Resource("", "pods", "log"),
    Resource("", "secrets"),
    Resource("", "configmaps"),
    Resource("apps", "deployments"),
    Resource("apps", "deployments", "scale"),
    Resource("", "nodes", namespaced=False),
    Resource("scheduling.k8s.io", "priorityclasses", namespaced=False),
    Resource(RBAC, "roles"),
    Resource("batch", "jobs", "status"),
)
NON_RESOURCE_PATHS = ("/logs/kube.log", "/metrics", "/healthz", "/api", "/version/x")
IDENTITIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ana", ()),
    ("ana", ("devs",)),
    ("ben", ("ops", "ci")),
    ("cy", ("auditors",)),
    ("system:serviceaccount:team-a:builder", ()),
    ("nobody", ("devs", "ops")),
)


# ---------------------------------------------------------------- generating the policy


def _subset(rng: random.Random, pool: tuple[str, ...], most: int) -> list[str]:
    return sorted(rng.sample(pool, rng.randint(1, min(most, len(pool)))))


def _rule(rng: random.Random) -> dict[str, Any]:
    groups = ["*"] if rng.random() < 0.1 else _subset(rng, tuple({r.group for r in RESOURCES}), 2)
    forms = tuple(r.rule_form for r in RESOURCES)
    roll = rng.random()
    resources = ["*"] if roll < 0.08 else ["*/scale", "*/status"] if roll < 0.15 else _subset(rng, forms, 4)
    verbs = ["*"] if rng.random() < 0.1 else _subset(rng, VERBS, 4)
    rule: dict[str, Any] = {"apiGroups": groups, "resources": resources, "verbs": verbs}
    if rng.random() < 0.2:
        rule["resourceNames"] = ["alpha"] if rng.random() < 0.5 else ["alpha", "beta"]
    return rule


def _subjects(rng: random.Random, *, cluster: bool = False) -> list[dict[str, str]]:
    """Subjects of a binding; a ClusterRoleBinding's ServiceAccounts name their namespace (the
    apiserver refuses one without it)."""
    out = []
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.4:
            out.append({"kind": "User", "apiGroup": RBAC, "name": rng.choice(USERS[:3])})
        elif roll < 0.85:
            out.append({"kind": "Group", "apiGroup": RBAC, "name": rng.choice(GROUPS)})
        else:
            account = {"kind": "ServiceAccount", "name": "builder"}
            if rng.random() < 0.5 or cluster:
                account["namespace"] = "team-a"
            out.append(account)
    return out


def generate_policy(rng: random.Random) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for i in range(6):
        objects.append(
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "ClusterRole",
                "metadata": {"name": f"m-cr-{i}"},
                "rules": [_rule(rng) for _ in range(rng.randint(1, 3))],
            }
        )
    objects.append(
        {
            "apiVersion": f"{RBAC}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "m-cr-urls"},
            "rules": [{"nonResourceURLs": ["/logs/*", "/metrics"], "verbs": ["get"]}],
        }
    )
    roles = []
    for i in range(4):
        namespace = rng.choice(NAMESPACES)
        roles.append((namespace, f"m-role-{i}"))
        objects.append(
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "Role",
                "metadata": {"name": f"m-role-{i}", "namespace": namespace},
                "rules": [_rule(rng) for _ in range(rng.randint(1, 3))],
            }
        )
    for i in range(6):
        target = "m-cr-urls" if i == 0 else f"m-cr-{rng.randrange(6)}"
        objects.append(
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"m-crb-{i}"},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": target},
                "subjects": _subjects(rng, cluster=True),
            }
        )
    for i in range(9):
        namespace = rng.choice(NAMESPACES)
        roll = rng.random()
        if roll < 0.45:
            ref = {"apiGroup": RBAC, "kind": "ClusterRole", "name": f"m-cr-{rng.randrange(6)}"}
        elif roll < 0.9:
            own = [name for ns, name in roles if ns == namespace] or ["m-role-missing"]
            ref = {"apiGroup": RBAC, "kind": "Role", "name": rng.choice(own)}
        else:
            ref = {"apiGroup": RBAC, "kind": "ClusterRole", "name": "m-cr-missing"}
        objects.append(
            {
                "apiVersion": f"{RBAC}/v1",
                "kind": "RoleBinding",
                "metadata": {"name": f"m-rb-{i}", "namespace": namespace},
                "roleRef": ref,
                "subjects": _subjects(rng),
            }
        )
    return objects


# ---------------------------------------------------------------- the independent evaluation


def effective_groups(user: str, groups: tuple[str, ...]) -> tuple[str, ...]:
    """What an impersonated identity ends up with (documented impersonation behaviour)."""
    if not groups and user.startswith("system:serviceaccount:"):
        namespace = user.split(":")[2]
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")
    return (*groups, "system:authenticated")


class Oracle:
    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects

    def _of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def _role_rules(self, ref: dict[str, str], namespace: str) -> list[dict[str, Any]]:
        for role in self._of(ref["kind"]):
            meta = role["metadata"]
            if meta["name"] == ref["name"] and (
                ref["kind"] == "ClusterRole" or meta.get("namespace") == namespace
            ):
                return role.get("rules") or []
        return []

    @staticmethod
    def _subject_is(subject: dict[str, str], user: str, groups: tuple[str, ...], binding_ns: str) -> bool:
        if subject["kind"] == "User":
            return subject["name"] == user
        if subject["kind"] == "Group":
            return subject["name"] in groups
        namespace = subject.get("namespace") or binding_ns
        return bool(namespace) and user == f"system:serviceaccount:{namespace}:{subject['name']}"

    def rules(self, user: str, groups: tuple[str, ...], namespace: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for binding in self._of("ClusterRoleBinding"):
            if any(self._subject_is(s, user, groups, "") for s in binding.get("subjects") or []):
                found += self._role_rules(binding["roleRef"], "")
        for binding in self._of("RoleBinding"):
            if (
                namespace
                and binding["metadata"]["namespace"] == namespace
                and any(self._subject_is(s, user, groups, namespace) for s in binding.get("subjects") or [])
            ):
                found += self._role_rules(binding["roleRef"], namespace)
        return found

    def allows(
        self, user: str, groups: tuple[str, ...], verb: str, res: Resource, namespace: str, name: str
    ) -> bool:
        if "system:masters" in groups:
            return True
        for rule in self.rules(user, groups, namespace):
            resources = rule.get("resources") or []
            names = rule.get("resourceNames") or []
            if (
                (verb in rule["verbs"] or "*" in rule["verbs"])
                and (res.group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
                and (
                    "*" in resources
                    or res.rule_form in resources
                    or (res.subresource and f"*/{res.subresource}" in resources)
                )
                and (not names or name in names)
            ):
                return True
        return False

    def allows_path(self, user: str, groups: tuple[str, ...], verb: str, path: str) -> bool:
        for rule in self.rules(user, groups, ""):
            urls = rule.get("nonResourceURLs") or []
            if (verb in rule["verbs"] or "*" in rule["verbs"]) and any(
                u == "*" or u == path or (u.endswith("*") and path.startswith(u[:-1])) for u in urls
            ):
                return True
        return False


# ---------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def matrix(auth_server: testing.ApiServerProcess, kit: Any) -> tuple[Oracle, random.Random]:
    rng = random.Random(SEED)
    for namespace in NAMESPACES:
        auth_server.kubectl("create", "namespace", namespace)
    objects = generate_policy(rng)
    client = kit.Client(auth_server)
    try:
        for obj in objects:
            namespace = obj["metadata"].get("namespace")
            plural = {
                "ClusterRole": "clusterroles",
                "Role": "roles",
                "ClusterRoleBinding": "clusterrolebindings",
                "RoleBinding": "rolebindings",
            }[obj["kind"]]
            where = f"/namespaces/{namespace}" if namespace else ""
            status, body = client.request("POST", f"/apis/{RBAC}/v1{where}/{plural}", obj)
            assert status == 201, body
        # The bootstrap policy is part of what applies (discovery, health, reviews).
        for plural in ("clusterroles", "clusterrolebindings"):
            _, listed = client.request(
                "GET", f"/apis/{RBAC}/v1/{plural}?labelSelector=kubernetes.io/bootstrapping"
            )
            for item in listed["items"]:
                item["kind"] = (
                    plural[:-1]
                    .replace("clusterrolebinding", "ClusterRoleBinding")
                    .replace("clusterrole", "ClusterRole")
                )
                objects.append(item)
    finally:
        client.close()
    return Oracle(objects), rng


def _attributes(verb: str, res: Resource, namespace: str, name: str) -> dict[str, str]:
    attributes = {"verb": verb, "group": res.group, "resource": res.resource}
    for key, value in (("subresource", res.subresource), ("namespace", namespace), ("name", name)):
        if value:
            attributes[key] = value
    return attributes


def test_access_reviews_agree_with_the_applied_rules_everywhere(
    auth_server: testing.ApiServerProcess, kit: Any, matrix: tuple[Oracle, random.Random]
) -> None:
    oracle, _ = matrix
    client = kit.Client(auth_server)
    mismatches, checked, allowed = [], 0, 0
    try:
        for (user, groups), verb, res, namespace, name in itertools.product(
            IDENTITIES, VERBS, RESOURCES, ("", *NAMESPACES), NAMES
        ):
            status, body = client.ssar(
                _attributes(verb, res, namespace, name), headers=kit.impersonating(user, groups)
            )
            assert status == 201, body
            want = oracle.allows(user, effective_groups(user, groups), verb, res, namespace, name)
            checked += 1
            allowed += want
            if body["status"]["allowed"] != want:
                mismatches.append(
                    (user, groups, verb, res.rule_form, res.group, namespace, name, body["status"])
                )
        for (user, groups), verb, path in itertools.product(IDENTITIES, ("get", "post"), NON_RESOURCE_PATHS):
            status, body = client.ssar(
                {"verb": verb, "path": path}, non_resource=True, headers=kit.impersonating(user, groups)
            )
            want = oracle.allows_path(user, effective_groups(user, groups), verb, path)
            checked += 1
            if body["status"]["allowed"] != want:
                mismatches.append((user, groups, verb, path, body["status"]))
    finally:
        client.close()
    assert not mismatches, f"{len(mismatches)} of {checked} differ, first: {mismatches[:5]}"
    # A matrix that allows nothing (or everything) would prove nothing.
    assert checked > 4000 and 0.05 < allowed / checked < 0.6, (allowed, checked)


def test_kubectl_auth_can_i_agrees_on_a_random_sample(
    auth_server: testing.ApiServerProcess, matrix: tuple[Oracle, random.Random]
) -> None:
    oracle, rng = matrix
    cases = list(
        itertools.product(
            IDENTITIES, ("get", "list", "create", "delete", "watch"), RESOURCES, ("", *NAMESPACES), NAMES
        )
    )
    sample = rng.sample(cases, 36)
    # Make sure the sample holds both answers.
    sample += [c for c in cases if oracle.allows(c[0][0], effective_groups(*c[0]), c[1], c[2], c[3], c[4])][
        :4
    ]
    wrong = []
    for (user, groups), verb, res, namespace, name in sample:
        target = f"{res.kubectl_form}/{name}" if name else res.kubectl_form
        args = ["auth", "can-i", verb, target, f"--as={user}", *(f"--as-group={g}" for g in groups)]
        args += [f"--subresource={res.subresource}"] if res.subresource else []
        args += ["-n", namespace] if namespace else ["--all-namespaces"]
        out = auth_server.kubectl(*args, check=False)
        want = oracle.allows(user, effective_groups(user, groups), verb, res, namespace, name)
        # A denial may carry the reason: "no - RBAC: clusterrole... not found".
        if out.stdout.split(" - ")[0].strip() != ("yes" if want else "no"):
            wrong.append((args, out.stdout, out.stderr))
    assert not wrong, wrong


def test_enforcement_agrees_with_the_reviews(
    auth_server: testing.ApiServerProcess, kit: Any, matrix: tuple[Oracle, random.Random]
) -> None:
    """Real GET/LIST requests under impersonation: 403 exactly where the rules say no."""
    oracle, rng = matrix
    client = kit.Client(auth_server)
    wrong = []
    try:
        plain = [r for r in RESOURCES if not r.subresource or r.subresource == "log"]
        for _ in range(80):
            user, groups = rng.choice(IDENTITIES)
            res = rng.choice(plain)
            namespace = rng.choice(NAMESPACES) if res.namespaced else ""
            name = rng.choice(NAMES)
            if res.subresource and not name:
                name = "alpha"
            verb = "get" if name else "list"
            where = f"/namespaces/{namespace}" if namespace else ""
            path = f"{res.path}{where}/{res.resource}" + (f"/{name}" if name else "")
            path += f"/{res.subresource}" if res.subresource else ""
            status, body = client.request("GET", path, headers=kit.impersonating(user, groups))
            want = oracle.allows(user, effective_groups(user, groups), verb, res, namespace, name)
            if (status != 403) != want:
                wrong.append((user, groups, path, status, body))
    finally:
        client.close()
    assert not wrong, wrong
