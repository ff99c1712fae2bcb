"""What changes when socialweb-computer runs as the single-file binary rather than from source.

scripts/build-binary.sh bundles the interpreter, the package and its libraries into
`dist/socialweb-computer` with PyInstaller (docs/packaging.md says why).  Three things then
differ from a source checkout, and this module is the one place that knows them:

- build information: the build script writes `_build.json` (commit, tree state, date) with
  `stamp()` and bundles it next to this package; `current()` reads it back, and a source
  checkout, which has no such file, reports `build: source`.  `socialweb-computer version`
  prints it.
- re-running oneself: in the binary `sys.executable` is the binary and there is no `-m`;
  `self_argv()` gives the right prefix for a command that starts another socialweb-computer.
- child processes: the bootloader points LD_LIBRARY_PATH at the bundle's private libraries
  (libssl, libsqlite3, ...); `child_env()` restores the caller's value so programs started
  from the binary (kubectl, ssh, qemu, ...) load the host's own libraries.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from collections.abc import Mapping
from pathlib import Path

from socialweb_computer import __version__

BUILD_FILE = "_build.json"
SOURCE = "source"
# Where the bundled build file sits: beside the package's modules, inside the bundle.
BUILD_PATH = Path(__file__).resolve().parent / BUILD_FILE
_LOADER_VARS = ("LD_LIBRARY_PATH",)


def _platform() -> str:
    # Go's GOOS/GOARCH spelling, as kubectl prints it.
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    return f"{sys.platform}/{machine}"


@dataclasses.dataclass(frozen=True)
class BuildInfo:
    """Who built this program and from what; `as_json()` names follow `kubectl version -o json`."""

    version: str
    build: str  # short commit of a binary, or "source"
    git_commit: str = ""
    git_tree_state: str = ""  # "clean", "dirty", or "" when unknown
    build_date: str = ""  # RFC 3339, UTC
    bundler: str = ""  # e.g. "PyInstaller 6.22.3"
    python_version: str = dataclasses.field(default_factory=platform.python_version)
    os_arch: str = dataclasses.field(default_factory=_platform)

    def as_json(self) -> dict[str, str]:
        return {
            "version": self.version,
            "build": self.build,
            "gitCommit": self.git_commit,
            "gitTreeState": self.git_tree_state,
            "buildDate": self.build_date,
            "bundler": self.bundler,
            "pythonVersion": self.python_version,
            "platform": self.os_arch,
        }


def frozen() -> bool:
    """True inside the single-file binary."""
    return bool(getattr(sys, "frozen", False))


def current(path: Path = BUILD_PATH) -> BuildInfo:
    """This program's build information; `build` is "source" when no build file is bundled."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return BuildInfo(version=__version__, build=SOURCE)
    commit = str(data.get("gitCommit", ""))
    return BuildInfo(
        version=__version__,
        build=commit[:12] or "unknown",
        git_commit=commit,
        git_tree_state=str(data.get("gitTreeState", "")),
        build_date=str(data.get("buildDate", "")),
        bundler=str(data.get("bundler", "")),
    )


def stamp(path: Path, *, git_commit: str, git_tree_state: str, build_date: str, bundler: str) -> None:
    """Write the build file that `current()` reads; called by scripts/build-binary.sh."""
    data = {"gitCommit": git_commit, "gitTreeState": git_tree_state, "buildDate": build_date,
            "bundler": bundler}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def self_argv() -> list[str]:
    """The command prefix that runs this same socialweb-computer again (add the subcommand)."""
    if frozen():
        return [sys.executable]
    return [sys.executable, "-m", "socialweb_computer"]


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with the dynamic loader path the user had before the binary.

    The bootloader saves the original value as `<VAR>_ORIG` (absent when there was none).
    From source this returns the environment unchanged.
    """
    result = dict(os.environ if env is None else env)
    if not frozen():
        return result
    for var in _LOADER_VARS:
        original = result.pop(f"{var}_ORIG", None)
        if original is None:
            result.pop(var, None)
        else:
            result[var] = original
    return result
