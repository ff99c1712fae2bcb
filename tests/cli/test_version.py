"""`socialweb-computer version` from a source checkout, and the build information behind it
(socialweb_computer.binary): "build: source" without a build file, the stamped commit, tree
state and date with one, and what changes inside the single-file binary (sys.frozen)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from socialweb_computer import __version__, binary
from socialweb_computer.cli import main, version

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_version_from_source_says_build_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"socialweb-computer {__version__}"
    assert lines[1] == "build: source"
    assert lines[2].startswith("python: 3.") and "linux/" in lines[2]


def test_version_json_names_fields_like_kubectl(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["version", "-o", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info == {
        "version": __version__,
        "build": "source",
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "bundler": "",
        "pythonVersion": info["pythonVersion"],
        "platform": info["platform"],
    }
    assert info["pythonVersion"] == ".".join(map(str, sys.version_info[:3]))


def test_version_runs_as_a_module() -> None:
    result = subprocess.run([sys.executable, "-m", "socialweb_computer", "version"], capture_output=True,
                            text=True, timeout=60, check=True)
    assert result.stdout.splitlines()[:2] == [f"socialweb-computer {__version__}", "build: source"]


def test_unknown_output_format_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main.main(["version", "-o", "yaml"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'yaml'" in capsys.readouterr().err


def test_stamped_build_file_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / binary.BUILD_FILE
    binary.stamp(path, git_commit=COMMIT, git_tree_state="clean", build_date="2026-01-02T03:04:05Z",
                 bundler="PyInstaller 6.22.3")
    info = binary.current(path)
    assert (info.version, info.build, info.git_commit) == (__version__, COMMIT[:12], COMMIT)
    assert version.render(info, "text").splitlines()[1] == (
        f"build: {COMMIT[:12]} (clean, 2026-01-02T03:04:05Z, PyInstaller 6.22.3)")
    assert json.loads(version.render(info, "json"))["gitTreeState"] == "clean"


def test_build_outside_git_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / binary.BUILD_FILE
    binary.stamp(path, git_commit="", git_tree_state="", build_date="2026-01-02T03:04:05Z", bundler="")
    info = binary.current(path)
    assert version.render(info, "text").splitlines()[1] == "build: unknown (2026-01-02T03:04:05Z)"


def test_no_build_file_in_the_source_tree() -> None:
    # Only the build script writes one, into its work directory; one here would mislabel source runs.
    assert not binary.BUILD_PATH.exists()
    assert binary.current().build == binary.SOURCE


def test_self_argv_from_source_and_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    assert binary.self_argv() == [sys.executable, "-m", "socialweb_computer"]
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert binary.self_argv() == [sys.executable]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"LD_LIBRARY_PATH": "/tmp/_MEI1", "HOME": "/home/ci"}, {"HOME": "/home/ci"}),
        ({"LD_LIBRARY_PATH": "/tmp/_MEI1:/opt/lib", "LD_LIBRARY_PATH_ORIG": "/opt/lib"},
         {"LD_LIBRARY_PATH": "/opt/lib"}),
    ],
    ids=["unset-before", "restored"],
)
def test_child_env_restores_the_loader_path_when_frozen(monkeypatch: pytest.MonkeyPatch,
                                                        given: dict[str, str],
                                                        expected: dict[str, str]) -> None:
    assert binary.child_env(given) == given
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    assert binary.child_env(given) == expected
