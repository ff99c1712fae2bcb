"""The RBAC authorizer: Kubernetes rule semantics over an in-memory index of one logical
cluster's Roles, ClusterRoles, RoleBindings and ClusterRoleBindings.

Semantics follow the real authorizer (rbac.go / rule.go): ClusterRoleBindings are visited
first, then the RoleBindings of the request's namespace; a binding applies when one of its
subjects is the user, one of their groups, or (ServiceAccount) their
`system:serviceaccount:<ns>:<name>`; a rule allows when verb, API group, resource
(`pods/exec`, `*`, `*/status`), resourceName and non-resource URL (`/api/*`) all match.
A binding to a missing role is an evaluation error that the denial reason carries
(`RBAC: clusterrole.rbac.authorization.k8s.io "x" not found`).

The index is loaded from the store at start and kept current through the store's
after-write hooks, so a decision never touches storage. Called by `policy.ClusterPolicy`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from socialweb_computer.auth import identity
from socialweb_computer.auth.attributes import Attributes, go_quote

GROUP = "rbac.authorization.k8s.io"
Object = dict[str, Any]

ROLES, CLUSTER_ROLES = "roles", "clusterroles"
ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS = "rolebindings", "clusterrolebindings"
PLURALS = (ROLES, CLUSTER_ROLES, ROLE_BINDINGS, CLUSTER_ROLE_BINDINGS)


@functools.lru_cache(maxsize=8192)
def _interned(*fields: tuple[str, ...]) -> Rule:
    """One shared Rule per distinct rule: every tenant's index holds the same bootstrap rules,
    and a Rule (with its precomputed sets) is immutable, so they need not be built per tenant."""
    return Rule(*fields)


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value or ())


@dataclasses.dataclass(frozen=True)
class Rule:
    """A PolicyRule, with sets precomputed for matching."""

    verbs: tuple[str, ...]
    api_groups: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        cache = self.__dict__
        cache["_verbs"] = frozenset(self.verbs)
        cache["_groups"] = frozenset(self.api_groups)
        cache["_resources"] = frozenset(self.resources)
        cache["_names"] = frozenset(self.resource_names)
        cache["_urls"] = frozenset(self.non_resource_urls)
        cache["_url_prefixes"] = tuple(u[:-1] for u in self.non_resource_urls if u.endswith("*"))

    @classmethod
    def from_dict(cls, rule: Object) -> Rule:
        return _interned(
            _strings(rule.get("verbs")),
            _strings(rule.get("apiGroups")),
            _strings(rule.get("resources")),
            _strings(rule.get("resourceNames")),
            _strings(rule.get("nonResourceURLs")),
        )

    def to_dict(self) -> Object:
        out: Object = {"verbs": list(self.verbs)}
        for key, value in (
            ("apiGroups", self.api_groups),
            ("resources", self.resources),
            ("resourceNames", self.resource_names),
            ("nonResourceURLs", self.non_resource_urls),
        ):
            if value:
                out[key] = list(value)
        return out

    def allows(self, attrs: Attributes) -> bool:
        """rbac.RuleAllows."""
        cache = self.__dict__
        verbs = cache["_verbs"]
        if attrs.verb not in verbs and "*" not in verbs:
            return False
        if not attrs.resource_request:
            return self._url_matches(attrs.path)
        groups = cache["_groups"]
        if attrs.api_group not in groups and "*" not in groups:
            return False
        resources = cache["_resources"]
        sub = attrs.subresource
        combined = f"{attrs.resource}/{sub}" if sub else attrs.resource
        if not ("*" in resources or combined in resources or (sub and f"*/{sub}" in resources)):
            return False
        names = cache["_names"]
        return not names or attrs.name in names

    def _url_matches(self, path: str) -> bool:
        urls = self.__dict__["_urls"]
        if "*" in urls or path in urls:
            return True
        return any(path.startswith(prefix) for prefix in self.__dict__["_url_prefixes"])


@dataclasses.dataclass(frozen=True)
class Subject:
    kind: str
    name: str
    namespace: str = ""

    def describe(self, binding_namespace: str) -> str:
        if self.kind == "ServiceAccount":
            return f"{self.kind} {go_quote(self.name + '/' + (self.namespace or binding_namespace))}"
        return f"{self.kind} {go_quote(self.name)}"


@dataclasses.dataclass(frozen=True)
class Binding:
    name: str
    namespace: str  # "" for a ClusterRoleBinding
    role_kind: str
    role_name: str
    subjects: tuple[Subject, ...]

    @classmethod
    def from_object(cls, obj: Object) -> Binding:
        meta = obj.get("metadata") or {}
        ref = obj.get("roleRef") or {}
        subjects = tuple(
            Subject(str(s.get("kind", "")), str(s.get("name", "")), str(s.get("namespace", "")))
            for s in obj.get("subjects") or ()
        )
        return cls(
            str(meta.get("name", "")),
            str(meta.get("namespace", "")),
            str(ref.get("kind", "")),
            str(ref.get("name", "")),
            subjects,
        )

    def usernames(self) -> Iterator[str]:
        """The user names this binding's User and ServiceAccount subjects match."""
        for s in self.subjects:
            if s.kind == "User":
                yield s.name
            elif s.kind == "ServiceAccount":
                namespace = s.namespace or self.namespace
                if namespace:
                    yield identity.service_account_username(namespace, s.name)

    def groups(self) -> Iterator[str]:
        return (s.name for s in self.subjects if s.kind == "Group")

    def first_subject_for(self, user: identity.UserInfo) -> Subject | None:
        """appliesTo: the first subject that is this user."""
        for s in self.subjects:
            if s.kind == "User" and s.name == user.name:
                return s
            if s.kind == "Group" and s.name in user.groups:
                return s
            if s.kind == "ServiceAccount":
                namespace = s.namespace or self.namespace
                if namespace and user.name == identity.service_account_username(namespace, s.name):
                    return s
        return None

    def describe(self, subject: Subject) -> str:
        if self.namespace:
            return (
                f"RoleBinding {go_quote(self.name + '/' + self.namespace)} of {self.role_kind} "
                f"{go_quote(self.role_name)} to {subject.describe(self.namespace)}"
            )
        return (
            f"ClusterRoleBinding {go_quote(self.name)} of {self.role_kind} {go_quote(self.role_name)} "
            f"to {subject.describe('')}"
        )


@dataclasses.dataclass(frozen=True)
class Grant:
    """One applicable binding with the rules of its role (or the error resolving it)."""

    binding: Binding
    subject: Subject
    rules: tuple[Rule, ...]
    error: str = ""


class Grants:
    """The grants of one (user, groups, namespace), with their rules bucketed for lookup.

    A decision must name the first allowing rule in visit order, as the real authorizer
    does; the buckets only narrow which rules are tried (those whose group and resource
    could match), so a large policy costs what its matching rules cost, not its size.
    """

    def __init__(self, grants: tuple[Grant, ...]) -> None:
        self.grants = grants
        self.errors = [g.error for g in grants if g.error]
        self.ordered: list[tuple[Rule, Grant]] = []
        self.buckets: dict[tuple[str, str], list[int]] = {}
        self.non_resource: list[int] = []
        for grant in grants:
            for rule in grant.rules:
                ordinal = len(self.ordered)
                self.ordered.append((rule, grant))
                if rule.non_resource_urls:
                    self.non_resource.append(ordinal)
                for key in itertools.product(rule.api_groups, rule.resources):
                    self.buckets.setdefault(key, []).append(ordinal)

    def __iter__(self) -> Iterator[Grant]:
        return iter(self.grants)

    def candidates(self, attrs: Attributes) -> list[int]:
        if not attrs.resource_request:
            return self.non_resource
        sub = attrs.subresource
        combined = f"{attrs.resource}/{sub}" if sub else attrs.resource
        resources = (combined, "*", f"*/{sub}") if sub else (combined, "*")
        found: set[int] = set()
        for group in (attrs.api_group, "*"):
            for resource in resources:
                found.update(self.buckets.get((group, resource), ()))
        return sorted(found)


class _BindingSet:
    """Bindings of one scope, indexed by the user names and groups their subjects name."""

    def __init__(self) -> None:
        self.by_name: dict[str, Binding] = {}
        self.by_user: dict[str, set[str]] = {}
        self.by_group: dict[str, set[str]] = {}

    def put(self, binding: Binding) -> None:
        self.remove(binding.name)
        self.by_name[binding.name] = binding
        for user in binding.usernames():
            self.by_user.setdefault(user, set()).add(binding.name)
        for group in binding.groups():
            self.by_group.setdefault(group, set()).add(binding.name)

    def remove(self, name: str) -> None:
        old = self.by_name.pop(name, None)
        if old is None:
            return
        for index, keys in ((self.by_user, old.usernames()), (self.by_group, old.groups())):
            for key in keys:
                names = index.get(key)
                if names is not None:
                    names.discard(name)
                    if not names:
                        del index[key]

    def applicable(self, user: identity.UserInfo) -> list[Binding]:
        names = set(self.by_user.get(user.name, ()))
        for group in user.groups:
            names.update(self.by_group.get(group, ()))
        # Sorted by name: deterministic reasons (the real lister order is arbitrary).
        return [self.by_name[n] for n in sorted(names)]


class Index:
    """The RBAC objects of one logical cluster, as the authorizer reads them."""

    _CACHE_LIMIT = 8192

    def __init__(self) -> None:
        self.cluster_roles: dict[str, Object] = {}
        self.roles: dict[tuple[str, str], Object] = {}
        self._cluster_role_rules: dict[str, tuple[Rule, ...]] = {}
        self._role_rules: dict[tuple[str, str], tuple[Rule, ...]] = {}
        self.cluster_bindings = _BindingSet()
        self.bindings: dict[str, _BindingSet] = {}
        self.generation = 0
        self._grants: dict[tuple[str, tuple[str, ...], str], Grants] = {}

    # ---------------------------------------------------------------- updates

    @staticmethod
    def parse(plural: str, obj: Object) -> tuple[Rule, ...] | Binding:
        """What the index keeps of an RBAC object; raises (ValueError, TypeError, AttributeError)
        for an object it cannot use, without changing the index."""
        if plural in (CLUSTER_ROLES, ROLES):
            rules = obj.get("rules") or ()
            if not isinstance(rules, list | tuple) or not all(isinstance(r, dict) for r in rules):
                raise ValueError("rules must be a list of PolicyRules")
            return tuple(Rule.from_dict(r) for r in rules)
        subjects = obj.get("subjects") or ()
        if not isinstance(obj.get("roleRef") or {}, dict) or not all(isinstance(s, dict) for s in subjects):
            raise ValueError("roleRef must be a RoleRef and subjects a list of Subjects")
        return Binding.from_object(obj)

    def put(self, plural: str, obj: Object) -> None:
        """Index `obj`; it is parsed whole first, so a failure leaves the index as it was."""
        meta = obj.get("metadata") or {}
        name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
        parsed = self.parse(plural, obj)
        if plural == CLUSTER_ROLES:
            assert isinstance(parsed, tuple)
            self.cluster_roles[name] = obj
            self._cluster_role_rules[name] = parsed
        elif plural == ROLES:
            assert isinstance(parsed, tuple)
            self.roles[(namespace, name)] = obj
            self._role_rules[(namespace, name)] = parsed
        elif plural == CLUSTER_ROLE_BINDINGS:
            assert isinstance(parsed, Binding)
            self.cluster_bindings.put(parsed)
        elif plural == ROLE_BINDINGS:
            assert isinstance(parsed, Binding)
            self.bindings.setdefault(namespace, _BindingSet()).put(parsed)
        self._changed()

    def remove(self, plural: str, obj: Object) -> None:
        meta = obj.get("metadata") or {}
        name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
        if plural == CLUSTER_ROLES:
            self.cluster_roles.pop(name, None)
            self._cluster_role_rules.pop(name, None)
        elif plural == ROLES:
            self.roles.pop((namespace, name), None)
            self._role_rules.pop((namespace, name), None)
        elif plural == CLUSTER_ROLE_BINDINGS:
            self.cluster_bindings.remove(name)
        elif plural == ROLE_BINDINGS and namespace in self.bindings:
            self.bindings[namespace].remove(name)
        self._changed()

    def _changed(self) -> None:
        self.generation += 1
        self._grants.clear()

    # ---------------------------------------------------------------- reads

    def role_rules(self, kind: str, name: str, namespace: str) -> tuple[tuple[Rule, ...], str]:
        """GetRoleReferenceRules: the rules a roleRef names, or the error the lister would give."""
        if kind == "ClusterRole":
            rules = self._cluster_role_rules.get(name)
            return (
                (rules, "") if rules is not None else ((), f"clusterrole.{GROUP} {go_quote(name)} not found")
            )
        if kind == "Role":
            rules = self._role_rules.get((namespace, name))
            return (rules, "") if rules is not None else ((), f"role.{GROUP} {go_quote(name)} not found")
        return (), f"unsupported role reference kind: {go_quote(kind)}"

    def grants(self, user: identity.UserInfo, namespace: str) -> Grants:
        """VisitRulesFor, resolved once per (user, groups, namespace) until RBAC objects change."""
        key = (user.name, user.groups, namespace)
        cached = self._grants.get(key)
        if cached is not None:
            return cached
        found = list(self._grants_of(self.cluster_bindings, user, ""))
        if namespace and namespace in self.bindings:
            found.extend(self._grants_of(self.bindings[namespace], user, namespace))
        result = Grants(tuple(found))
        if len(self._grants) >= self._CACHE_LIMIT:
            self._grants.clear()
        self._grants[key] = result
        return result

    def _grants_of(self, scope: _BindingSet, user: identity.UserInfo, namespace: str) -> Iterator[Grant]:
        for binding in scope.applicable(user):
            subject = binding.first_subject_for(user)
            if subject is None:
                continue
            rules, error = self.role_rules(binding.role_kind, binding.role_name, namespace)
            yield Grant(binding, subject, rules, error)


@dataclasses.dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


def aggregate_errors(messages: Iterable[str]) -> str:
    """utilerrors.NewAggregate(...).Error(): one message bare, several deduplicated in brackets."""
    unique: list[str] = []
    for message in messages:
        if message not in unique:
            unique.append(message)
    if len(unique) == 1:
        return unique[0]
    return "[" + ", ".join(unique) + "]"


def authorize(index: Index, attrs: Attributes) -> Decision:
    """RBACAuthorizer.Authorize."""
    grants = index.grants(attrs.user, attrs.namespace)
    for ordinal in grants.candidates(attrs):
        rule, grant = grants.ordered[ordinal]
        if rule.allows(attrs):
            return Decision(True, f"RBAC: allowed by {grant.binding.describe(grant.subject)}")
    return Decision(False, f"RBAC: {aggregate_errors(grants.errors)}" if grants.errors else "")


def rules_for(index: Index, user: identity.UserInfo, namespace: str) -> tuple[list[Rule], list[str]]:
    """RulesFor: every rule that applies to the user in the namespace, and resolution errors."""
    rules: list[Rule] = []
    errs: list[str] = []
    for grant in index.grants(user, namespace):
        if grant.error:
            errs.append(grant.error)
        rules.extend(grant.rules)
    return rules, errs
