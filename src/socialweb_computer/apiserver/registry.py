"""The kinds one logical cluster serves: the frozen built-in table plus its CRDs.

Lookups are by group/version/plural (URL routing) and by any name a user types
(`kubectl get po`): plural, singular, short name. CRD rows are swapped in and out
as whole immutable tuples, so readers never see a half-updated table.
"""

from __future__ import annotations

from collections.abc import Iterable

from socialweb_computer.apiserver import kinds


class Registry:
    def __init__(self, builtin: Iterable[kinds.KindInfo] = kinds.BUILTIN_KINDS) -> None:
        self._builtin = tuple(builtin)
        self._custom: tuple[kinds.KindInfo, ...] = ()
        self._index: dict[tuple[str, str, str], kinds.KindInfo] = {}
        self.generation = 0
        self._rebuild()

    def _rebuild(self) -> None:
        self._index = {(k.group, k.version, k.plural): k for k in self.all()}
        self.generation += 1

    def all(self) -> tuple[kinds.KindInfo, ...]:
        return self._builtin + self._custom

    def lookup(self, group: str, version: str, plural: str) -> kinds.KindInfo | None:
        return self._index.get((group, version, plural))

    def versions_of(self, group: str) -> list[str]:
        seen: list[str] = []
        for info in self.all():
            if info.group == group and info.version not in seen:
                seen.append(info.version)
        return seen

    def groups(self) -> list[str]:
        seen: list[str] = []
        for info in self.all():
            if info.group and info.group not in seen:
                seen.append(info.group)
        return seen

    def set_custom(self, custom: Iterable[kinds.KindInfo]) -> None:
        self._custom = tuple(custom)
        self._rebuild()

    def custom(self) -> tuple[kinds.KindInfo, ...]:
        return self._custom
