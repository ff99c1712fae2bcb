"""The `Priority` admission plugin of a real kube-apiserver, and the system PriorityClasses.

Why: every pod in a real cluster leaves admission with `spec.priority` and
`spec.preemptionPolicy` resolved from its `priorityClassName` (or from the globalDefault
class), and clients rely on the refusals word for word:

    pods "x" is forbidden: no PriorityClass with name foo was found
    pods "x" is forbidden: the integer value of priority (5) must not be provided in pod spec;
        priority admission controller computed 7 from the given PriorityClass name

It also keeps PriorityClasses to one globalDefault, creates `system-cluster-critical`
and `system-node-critical` at start, as the apiserver's bootstrap does, and refuses to
delete them (`this is a system priority class and cannot be deleted`).

Runs as a store `before_write` hook (after decoding, before defaults and validation, like
upstream's mutating admission) over a PriorityClass index the store's `after_write` hook
keeps current, so a check never reads storage. Created and started by
`apiserver.cluster.LogicalCluster`.
"""

from __future__ import annotations

import copy
from typing import Any

from socialweb_computer.api import errors
from socialweb_computer.apiserver import kinds
from socialweb_computer.apiserver import store as store_mod

Object = dict[str, Any]
GROUP, PLURAL = "scheduling.k8s.io", "priorityclasses"
DEFAULT_POLICY = "PreemptLowerPriority"
SYSTEM_CLASSES = (
    {"metadata": {"name": "system-node-critical"}, "value": 2000001000,
     "description": "Used for system critical pods that must not be moved from their current node."},
    {"metadata": {"name": "system-cluster-critical"}, "value": 2000000000,
     "description": "Used for system critical pods that must run in the cluster, but can be moved to "
                    "another node if necessary."},
)

SYSTEM_NAMES = frozenset(c["metadata"]["name"] for c in SYSTEM_CLASSES)


def _forbidden(plural: str, group: str, obj: Object, why: str) -> errors.StatusError:
    """admission.NewForbidden: names the object by generateName while it has no name yet."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") or meta.get("generateName") or "Unknown"
    resource = f"{plural}.{group}" if group else plural
    return errors.forbidden(f'{resource} "{name}" is forbidden: {why}', plural, name, group)


class PriorityAdmission:
    def __init__(self, store: store_mod.Store) -> None:
        self.store = store
        self.classes: dict[str, Object] = {}
        store.after_write.append(self._after_write)
        store.before_write.append(self._before_write)
        store.before_delete.append(self._before_delete)

    @property
    def _kind(self) -> kinds.KindInfo:
        kind = self.store.registry.lookup(GROUP, "v1", PLURAL)
        assert kind is not None
        return kind

    async def start(self) -> None:
        listed = await self.store.list(self._kind, "", store_mod.ListOptions())
        for item in listed["items"]:
            self._remember(item)
        for system in SYSTEM_CLASSES:
            if system["metadata"]["name"] in self.classes:
                continue
            try:
                await self.store.create(self._kind, "", copy.deepcopy(system),
                                        store_mod.WriteOptions(field_manager="kube-apiserver"))
            except errors.StatusError as e:
                if e.reason != "AlreadyExists":
                    raise

    def default_class(self) -> Object | None:
        """The globalDefault class; if a race left several, the lowest value wins (as upstream)."""
        defaults = [c for c in self.classes.values() if c.get("globalDefault")]
        return min(defaults, key=lambda c: c.get("value", 0)) if defaults else None

    # ---------------------------------------------------------------- hooks

    def _after_write(self, kind: kinds.KindInfo, event: str, new: Object | None, old: Object | None) -> None:
        if kind.group != GROUP or kind.plural != PLURAL:
            return
        if event == "DELETED":
            assert old is not None
            self.classes.pop(old["metadata"]["name"], None)
        elif new is not None:
            self._remember(new)

    def _remember(self, pc: Object) -> None:
        # Only what admission reads, copied: the written object is also the client's reply.
        name = pc["metadata"]["name"]
        self.classes[name] = {"metadata": {"name": name}, "value": pc.get("value", 0),
                              "globalDefault": bool(pc.get("globalDefault")),
                              "preemptionPolicy": pc.get("preemptionPolicy")}

    def _before_write(self, kind: kinds.KindInfo, new: Object, old: Object | None) -> None:
        if kind.group == "" and kind.plural == "pods":
            if old is None:
                self.admit_pod(new)
            else:
                self._keep_priority(new, old)
        elif kind.group == GROUP and kind.plural == PLURAL:
            self.validate_class(new, creating=old is None)

    @staticmethod
    def _before_delete(kind: kinds.KindInfo, obj: Object) -> None:
        name = obj["metadata"]["name"]
        if kind.group == GROUP and kind.plural == PLURAL and name in SYSTEM_NAMES:
            raise errors.forbidden(f'{PLURAL}.{GROUP} "{name}" is forbidden: this is a system priority class '
                                   "and cannot be deleted", PLURAL, name, GROUP)

    def admit_pod(self, pod: Object) -> None:
        spec = pod.get("spec")
        if not isinstance(spec, dict):
            return  # validation reports it
        name = spec.get("priorityClassName") or ""
        if name:
            chosen = self.classes.get(name)
            if chosen is None:
                raise _forbidden("pods", "", pod, f"no PriorityClass with name {name} was found")
            priority, policy = chosen.get("value", 0), chosen.get("preemptionPolicy")
        else:
            chosen = self.default_class()
            if chosen is not None:
                spec["priorityClassName"] = chosen["metadata"]["name"]
            priority = chosen.get("value", 0) if chosen else 0
            policy = chosen.get("preemptionPolicy") if chosen else DEFAULT_POLICY
        given = spec.get("priority")
        if given is not None and given != priority:
            raise _forbidden("pods", "", pod,
                             f"the integer value of priority ({given}) must not be provided in pod spec; "
                             f"priority admission controller computed {priority} from the given "
                             "PriorityClass name")
        spec["priority"] = priority
        if policy:
            given_policy = spec.get("preemptionPolicy")
            if given_policy is not None and given_policy != policy:
                raise _forbidden("pods", "", pod,
                                 f"the string value of PreemptionPolicy ({given_policy}) must not be "
                                 f"provided in pod spec; priority admission controller computed {policy} "
                                 "from the given PriorityClass name")
            spec["preemptionPolicy"] = policy

    @staticmethod
    def _keep_priority(new: Object, old: Object) -> None:
        """Set on create, these are kept when an update omits them (validation forbids changes)."""
        spec, old_spec = new.get("spec"), old.get("spec") or {}
        if not isinstance(spec, dict):
            return
        for field in ("priority", "preemptionPolicy"):
            if spec.get(field) is None and old_spec.get(field) is not None:
                spec[field] = old_spec[field]

    def validate_class(self, pc: Object, *, creating: bool) -> None:
        if not pc.get("globalDefault"):
            return
        current = self.default_class()
        name = (pc.get("metadata") or {}).get("name")
        if current is not None and (creating or current["metadata"]["name"] != name):
            raise _forbidden(PLURAL, GROUP, pc, f"PriorityClass {current['metadata']['name']} is already "
                             "marked as default. Only one default can exist")
