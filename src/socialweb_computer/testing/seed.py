"""The operator page's own text, for tests that run its commands as written.

`docs/01-the-kcp-server.md` is the project's version of the page the project was specified
from; tests take step 5's YAML from it rather than from a copy, so the page and what the
tests prove cannot drift apart.
"""

from __future__ import annotations

import re

from socialweb_computer.testing import server

OPERATOR_PAGE = server.REPO_ROOT / "docs" / "01-the-kcp-server.md"


def runner_rbac_yaml() -> str:
    """Step 5: the heredoc applied to the tenant cluster (Namespace, ClusterRole, ClusterRoleBinding)."""
    match = re.search(r"<<'YAML'\n(.*?)\nYAML\n", OPERATOR_PAGE.read_text(), re.S)
    if match is None:
        raise ValueError(f"{OPERATOR_PAGE} has no step-5 heredoc (<<'YAML' ... YAML)")
    return match[1] + "\n"
