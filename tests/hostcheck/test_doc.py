"""docs/host-contract.md and the check table stay in step: the same checks, in the same order,
with the same roles, why and fix, both ways."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from socialweb_computer.cli import main as cli_main
from socialweb_computer.hostcheck import checks, context

DOC = Path(__file__).parents[2] / "docs" / "host-contract.md"


def _flat(text: str) -> str:
    """One line, no Markdown code marks: the doc may wrap and format, the words must match."""
    return " ".join(text.replace("`", "").split())


def _field(body: str, label: str, name: str) -> str:
    match = re.search(rf"^\*\*{label}:\*\* (.+?)(?:\n\s*\n|\Z)", body, re.M | re.S)
    assert match, f"docs/host-contract.md: check {name} has no **{label}:** paragraph"
    return _flat(match[1])


def documented() -> list[dict[str, object]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("\n## Checks\n", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^### `([^`]+)`[ \t]*$", section, flags=re.M)
    rows = []
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        roles = re.search(r"^Roles: (.+)$", body, re.M)
        assert roles, f"docs/host-contract.md: check {name} has no Roles: line"
        rows.append({"name": name, "roles": {r.strip() for r in roles[1].split(",")},
                     "why": _field(body, "Why", name), "fix": _field(body, "Fix", name)})
    return rows


def in_code() -> list[dict[str, object]]:
    return [{"name": c.name, "roles": set(c.roles), "why": _flat(c.why), "fix": _flat(c.fix)}
            for c in checks.CHECKS]


def test_the_doc_lists_exactly_the_checks_of_the_table_in_order() -> None:
    assert [r["name"] for r in documented()] == [r["name"] for r in in_code()]


@pytest.mark.parametrize("row", in_code(), ids=lambda r: str(r["name"]))
def test_each_check_has_the_same_roles_why_and_fix_in_the_doc(row: dict[str, object]) -> None:
    doc = {r["name"]: r for r in documented()}
    assert doc.get(row["name"]) == row


def test_every_role_is_known_and_every_check_applies_to_one() -> None:
    for check in checks.CHECKS:
        assert check.roles and check.roles <= set(context.ROLES), check.name
    assert len({c.name for c in checks.CHECKS}) == len(checks.CHECKS)


def test_help_explains_the_command_and_lists_every_check(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main(["check-host", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "exit status: 0 every check passed, 1 at least one check failed, 2 usage error." in out
    assert "docs/host-contract.md" in out
    for check in checks.CHECKS:
        row = rf"^  {re.escape(check.name)} +{', '.join(sorted(check.roles))}$"
        assert re.search(row, out, re.M), check.name
