"""The gateway spec snippets of the operator pages are specs the gateway accepts, with the
values the page says."""

from __future__ import annotations

import re

import yaml

from socialweb_computer.gateway import spec
from socialweb_computer.testing import server


def _yaml_blocks(page: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", (server.REPO_ROOT / "docs" / page).read_text(), re.S)


def test_03s_capacity_settings_are_a_valid_spec() -> None:
    [block] = _yaml_blocks("03-jobs.md")
    parsed = spec.parse(yaml.safe_load(block), source="docs/03-jobs.md")
    assert parsed.capacity.bidder == "qemu"
    assert parsed.node_defaults.release_after_seconds == 120  # the hold the page names
    assert [c.name for c in parsed.clusters] == ["ci"]
