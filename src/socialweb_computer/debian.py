"""Packages from Debian's archive for the project's build steps, without touching apt.

Several build steps read upstream files that Debian packages: the Kubernetes `.proto`
files (`apiserver/protobuf/build.py`), the CRI `api.proto` (`node/cri/build.py`), and
later the kernel and packages of a guest image. Rather than copying those files into the
repository, each step downloads the `.deb` it needs with `apt-get download`, using a
private sources list and state directory so the system's apt configuration is never
touched; the mirror is the one the system's own apt sources already use, with the suite
swapped (a newer suite than the host's is how we get newer upstream files).

Downloaded `.deb` files are kept in a cache directory chosen by the caller, so a rebuild
needs no network. `SOCIALWEB_DEBIAN_MIRROR` overrides the mirror.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

MIRROR_ENV = "SOCIALWEB_DEBIAN_MIRROR"
# Suites of Debian's main archive (not security, not backports) that can supply a mirror URI.
_DEBIAN_SUITE = re.compile(r"^[a-z]+(-updates)?$")


class ArchiveError(RuntimeError):
    """A package could not be downloaded or unpacked; the message says which and why."""


def _apt_source_files() -> list[Path]:
    out = subprocess.run(
        ["apt-config", "shell", "LIST", "Dir::Etc::SourceList/f", "PARTS", "Dir::Etc::SourceParts/d"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    values = dict(re.findall(r"^(\w+)='([^']*)'", out, re.MULTILINE))
    files = [Path(values.get("LIST", "/etc/apt/sources.list"))]
    parts = Path(values.get("PARTS", "/etc/apt/sources.list.d"))
    if parts.is_dir():
        files += sorted(p for p in parts.iterdir() if p.suffix in (".list", ".sources"))
    return [f for f in files if f.is_file()]


def _entries_deb822(text: str) -> Iterable[tuple[str, list[str], list[str], str]]:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0].isspace() and key:
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield (
                uri,
                fields.get("suites", "").split(),
                fields.get("components", "").split(),
                fields.get("signed-by", ""),
            )


def _entries_one_line(text: str) -> Iterable[tuple[str, list[str], list[str], str]]:
    for line in text.splitlines():
        match = re.match(r"^\s*deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s+(.*)$", line)
        if not match:
            continue
        options = dict(o.split("=", 1) for o in (match.group(1) or "").split() if "=" in o)
        yield match.group(2), [match.group(3)], match.group(4).split(), options.get("signed-by", "")


def system_mirror() -> tuple[str, str]:
    """(URI, Signed-By keyring) of the Debian main archive the system's apt already uses."""
    override = os.environ.get(MIRROR_ENV)
    if override:
        return override, ""
    for path in _apt_source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        entries = _entries_deb822(text) if path.suffix == ".sources" else _entries_one_line(text)
        for uri, suites, components, signed_by in entries:
            if (
                "main" in components
                and any(_DEBIAN_SUITE.match(s) for s in suites)
                and uri.rstrip("/").endswith("/debian")
            ):
                keyring = signed_by if signed_by.startswith("/") and Path(signed_by).is_file() else ""
                return uri, keyring
    raise ArchiveError(
        f"no Debian archive found in the system's apt sources; set {MIRROR_ENV} to a mirror URI"
    )


def _apt_options(state: Path) -> list[str]:
    """Points every apt path that matters at a private directory."""
    empty = state / "empty.d"
    empty.mkdir(exist_ok=True)
    return [
        "-o",
        f"Dir::Etc::SourceList={state / 'private.sources'}",
        "-o",
        f"Dir::Etc::SourceParts={empty}",
        "-o",
        "Dir::Etc::Preferences=/dev/null",
        "-o",
        f"Dir::Etc::PreferencesParts={empty}",
        "-o",
        f"Dir::State::Lists={state / 'lists'}",
        "-o",
        f"Dir::Cache={state / 'cache'}",
        "-o",
        "Acquire::Languages=none",
        "-o",
        "APT::Sandbox::User=root",
        "-q",
    ]


@contextlib.contextmanager
def _private_apt(suite: str) -> Iterator[list[str]]:
    """apt options for a private state of `suite` (its lists updated), removed afterwards."""
    uri, keyring = system_mirror()
    with tempfile.TemporaryDirectory(prefix="debian-apt-") as tmp:
        state = Path(tmp)
        (state / "lists" / "partial").mkdir(parents=True)
        (state / "cache" / "archives" / "partial").mkdir(parents=True)
        stanza = f"Types: deb\nURIs: {uri}\nSuites: {suite}\nComponents: main\n"
        if keyring:
            stanza += f"Signed-By: {keyring}\n"
        (state / "private.sources").write_text(stanza)
        # An empty package database: apt resolves every dependency as for an empty system.
        (state / "status").write_text("")
        options = [*_apt_options(state), "-o", f"Dir::State::status={state / 'status'}"]
        run(["apt-get", *options, "update"])
        yield options


def download(
    packages: Iterable[str], suite: str, dest: Path, *, log: Callable[[str], None] | None = None
) -> list[Path]:
    """Downloads the newest `.deb` of each package in `suite` into `dest` (replacing older ones)."""
    packages = list(packages)
    if log is not None:
        log(f"downloading {', '.join(packages)} from Debian {suite}")
    with _private_apt(suite) as options:
        dest.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix="download-", dir=dest))
        try:
            run(["apt-get", *options, "download", *packages], cwd=staging)
            for package in packages:
                for old in dest.glob(f"{package}_*.deb"):
                    old.unlink()
            for deb in staging.glob("*.deb"):
                deb.replace(dest / deb.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return cached_debs(packages, dest)


def _closure_record(packages: list[str], suite: str, dest: Path) -> Path:
    key = hashlib.sha256(_compact_json([suite, sorted(packages)])).hexdigest()[:16]
    return dest / "closures" / f"{suite}-{key}.json"


def closure(
    packages: Iterable[str],
    suite: str,
    dest: Path,
    *,
    refresh: bool = False,
    log: Callable[[str], None] | None = None,
) -> list[Path]:
    """The `.deb` files of `packages` and everything they depend on (not Recommends), in `dest`.

    apt resolves the dependencies as for an empty system (Depends and Pre-Depends, virtual
    packages, alternatives), so the set is what a root filesystem made of these packages
    needs. The resolved set is remembered in `dest/closures/`, so a later call with the same
    packages needs no network unless `refresh`.
    """
    packages = sorted(set(packages))
    record = _closure_record(packages, suite, dest)
    if not refresh and record.is_file():
        names = json.loads(record.read_bytes())
        debs = [dest / name for name in names]
        if all(deb.is_file() for deb in debs):
            return debs
    if log is not None:
        log(f"resolving and downloading {len(packages)} packages and their dependencies from Debian {suite}")
    with _private_apt(suite) as options:
        dest.mkdir(parents=True, exist_ok=True)
        cache = Path(tempfile.mkdtemp(prefix="closure-", dir=dest))
        try:
            (cache / "archives" / "partial").mkdir(parents=True)
            run(
                [
                    "apt-get",
                    *options,
                    "-o",
                    f"Dir::Cache={cache}",
                    "install",
                    "--download-only",
                    "--no-install-recommends",
                    "-y",
                    *packages,
                ]
            )
            names = []
            for deb in sorted((cache / "archives").glob("*.deb")):
                deb.replace(dest / deb.name)
                names.append(deb.name)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    if not names:
        raise ArchiveError(f"apt resolved nothing for {', '.join(packages)} in Debian {suite}")
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_suffix(".partial")
    partial.write_bytes(_compact_json(names))
    partial.replace(record)
    return [dest / name for name in names]


def cached_debs(packages: Iterable[str], cache: Path) -> list[Path]:
    """The cached `.deb` of every package, or [] when any one is missing."""
    found = []
    for package in packages:
        debs = sorted(cache.glob(f"{package}_*.deb"))
        if not debs:
            return []
        found.append(debs[-1])
    return found


def obtain(
    packages: Iterable[str],
    suite: str,
    cache: Path,
    *,
    refresh: bool = False,
    log: Callable[[str], None] | None = None,
) -> list[Path]:
    """Cached `.deb` files when all are there (and not `refresh`), else downloaded ones."""
    packages = list(packages)
    debs = [] if refresh else cached_debs(packages, cache)
    if not debs:
        debs = download(packages, suite, cache, log=log)
    if len(debs) != len(packages):
        raise ArchiveError(f"could not obtain {', '.join(packages)} from Debian {suite}")
    return debs


def extract(deb: Path, dest: Path) -> None:
    run(["dpkg-deb", "-x", str(deb), str(dest)])


def deb_version(deb: Path) -> str:
    return run(["dpkg-deb", "-f", str(deb), "Version"]).strip()


def run(command: list[str], cwd: Path | None = None) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ArchiveError(
            f"{command[0]} {command[-1]} failed ({result.returncode}):\n{result.stderr.strip()}"
        )
    return result.stdout


def _compact_json(value: object) -> bytes:
    # Standard-library JSON, not orjson: the wheel's build step imports this module inside the
    # build backend's isolated environment, where only setuptools is installed. The bytes match
    # orjson's compact output, so cache keys made earlier stay valid.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
