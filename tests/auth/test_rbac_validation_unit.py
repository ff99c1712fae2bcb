"""The RBAC kinds' defaulting and validation (apiserver.strategies.rbac), checked directly: its messages,
and that every bootstrap object passes it (so wiring it into the strategies breaks nothing)."""

from __future__ import annotations

from socialweb_computer.apiserver.strategies import rbac as validation
from socialweb_computer.auth import bootstrap

RBAC = "rbac.authorization.k8s.io"


def _messages(causes: list[object]) -> list[tuple[str, str]]:
    return [(c.field, c.message) for c in causes]  # type: ignore[attr-defined]


def test_bootstrap_objects_are_valid() -> None:
    for role in bootstrap.cluster_roles():
        assert validation.STRATEGIES[(RBAC, "ClusterRole")].validate(role) == [], role["metadata"]["name"]
    for binding in bootstrap.cluster_role_bindings():
        assert validation.STRATEGIES[(RBAC, "ClusterRoleBinding")].validate(binding) == []


def test_rules_are_validated_like_upstream() -> None:
    role = validation.STRATEGIES[(RBAC, "Role")]
    got = _messages(
        role.validate(
            {
                "rules": [
                    {"apiGroups": [""], "resources": ["pods"]},
                    {"verbs": ["get"]},
                    {"verbs": ["get"], "nonResourceURLs": ["/logs"], "resources": ["pods"]},
                ]
            }
        )
    )
    assert got == [
        ("rules[0].verbs", "Required value: verbs must contain at least one value"),
        ("rules[1].apiGroups", "Required value: resource rules must supply at least one api group"),
        ("rules[1].resources", "Required value: resource rules must supply at least one resource"),
        (
            "rules[2].nonResourceURLs",
            'Invalid value: []string{"/logs"}: namespaced rules cannot apply to non-resource URLs',
        ),
        (
            "rules[2].nonResourceURLs",
            'Invalid value: []string{"/logs"}: rules cannot apply to both regular resources and '
            "non-resource URLs",
        ),
    ]


def test_bindings_are_defaulted_and_their_role_ref_is_immutable() -> None:
    strategy = validation.STRATEGIES[(RBAC, "ClusterRoleBinding")]
    binding = {
        "roleRef": {"kind": "ClusterRole", "name": "view"},
        "subjects": [
            {"kind": "User", "name": "ana"},
            {"kind": "ServiceAccount", "name": "bot"},
            {"kind": "Robot", "name": "r2"},
        ],
    }
    strategy.prepare_for_create(binding)
    assert binding["roleRef"]["apiGroup"] == RBAC and binding["subjects"][0]["apiGroup"] == RBAC
    assert _messages(strategy.validate(binding)) == [
        ("subjects[1].namespace", "Required value"),
        (
            "subjects[2].kind",
            'Unsupported value: "Robot": supported values: "ServiceAccount", "User", "Group"',
        ),
    ]
    changed = {**binding, "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "edit"}}
    assert (
        "roleRef",
        'Invalid value: rbac.RoleRef{APIGroup:"rbac.authorization.k8s.io", Kind:"ClusterRole", '
        'Name:"edit"}: cannot change roleRef',
    ) in _messages(strategy.validate_update(changed, binding))
