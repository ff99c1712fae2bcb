"""A command loads only what it needs: `--version`, `image` and the host checks answer without
importing the API server, whose import is most of a command's start-up time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SERVER = "socialweb_computer.apiserver"


def server_modules_after(code: str) -> list[str]:
    loaded = f"sorted(m for m in sys.modules if m.startswith({SERVER!r}))"
    probe = f"{code}\nimport json, sys\nprint(json.dumps({loaded}))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "module",
    [
        "socialweb_computer.cli.image",
        "socialweb_computer.hostcheck.context",
        "socialweb_computer.hostcheck.statedir",
    ],
)
def test_the_module_does_not_import_the_api_server(module: str) -> None:
    assert server_modules_after(f"import {module}") == []


def test_version_loads_no_server() -> None:
    code = "import contextlib, io\nfrom socialweb_computer.cli import main\n"
    code += "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
    code += "    main.main(['--version'])\n"
    assert server_modules_after(code) == []
