"""Sanity checks of the pinned client tools every end-to-end test depends on.

If these fail, nothing that talks to the server through kubectl or helm can be trusted:
the binaries come from scripts/install-tools.sh into .tools/bin, and must be found first on
PATH (the machine's own /usr/bin/kubectl is a different, older build).
"""

from __future__ import annotations

import json
import shutil
import subprocess

from socialweb_computer import testing
from socialweb_computer.testing import server as server_module


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60,
                          stdin=subprocess.DEVNULL).stdout


def test_kubectl_is_1_37_1() -> None:
    kubectl = testing.tool_path("kubectl")
    version = json.loads(run(str(kubectl), "version", "--client", "-o", "json"))
    assert version["clientVersion"]["gitVersion"] == "v1.37.1"


def test_helm_is_4() -> None:
    helm = testing.tool_path("helm")
    assert run(str(helm), "version", "--short").startswith("v4.")


def test_pinned_tools_come_first_on_path() -> None:
    assert shutil.which("kubectl") == str(server_module.TOOLS_BIN / "kubectl")
    assert shutil.which("helm") == str(server_module.TOOLS_BIN / "helm")
