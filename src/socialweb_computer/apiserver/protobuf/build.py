"""Build step: generate the protobuf field table from Debian's Kubernetes API packages.

Run as `python -m socialweb_computer.apiserver.protobuf.build` (the project's install
and test scripts do). kubectl sends typed objects as protobuf; to decode them the
server needs every message's field numbers, types and JSON names. Rather than
copying `.proto` files or typing tables into the repository, this step:

1. downloads Debian's `golang-k8s-api-dev` and `golang-k8s-apimachinery-dev` (which
   carry the upstream `generated.proto` files and the Go API types) and
   `golang-github-google-gnostic-models-dev` (gnostic's `openapiv2/OpenAPIv2.proto`, the
   message `/openapi/v2` is served as in protobuf) through
   `socialweb_computer.debian` (a private apt state; the system's apt configuration is
   never touched; default suite: trixie);
2. unpacks them with `dpkg-deb -x` into a temporary directory;
3. parses the `.proto` files (`protofile.py`) for field numbers and wire types and
   the Go struct tags beside them (`gotypes.py`) for JSON names, `omitempty`,
   pointers and inlined structs;
4. parses gnostic's `OpenAPIv2.proto` the same way into the `openapi_v2` part of the table
   (field numbers, names, types and which fields share a `oneof`), which
   `openapi_v2.py` encodes the OpenAPI v2 document with;
5. writes `generated/fields.json` next to this module (gitignored).

It is idempotent: when the table exists and was made by the same builder from the
same inputs, it returns at once without touching the network; downloaded `.deb`
files are cached (default `.tools/cache/k8s-protobuf` in the repository, or
$SOCIALWEB_PROTOBUF_CACHE) so a rebuild after a code change needs no network either.
`--force` rebuilds from the cached packages, `--refresh` downloads them again. Building a
wheel runs this step too (setup.py), so an installed wheel carries the table.

Debian trixie carries 0.32.x of these libraries, i.e. the Kubernetes 1.32 API:
fields added in 1.33 and later are not in the table; the decoder reports them
(see `decoder.py`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from socialweb_computer import debian
from socialweb_computer.apiserver.protobuf import gotypes, protofile

PACKAGES = ("golang-k8s-api-dev", "golang-k8s-apimachinery-dev", "golang-github-google-gnostic-models-dev")
DEFAULT_SUITE = "trixie"
FORMAT = 1
CACHE_ENV = "SOCIALWEB_PROTOBUF_CACHE"  # where the downloaded .deb files are kept, if set

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "generated" / "fields.json"
GO_SRC = Path("usr/share/gocode/src")
GNOSTIC_V2 = GO_SRC / "github.com/google/gnostic-models/openapiv2/OpenAPIv2.proto"
# Upstream's own test group; no client sends it.
SKIPPED_DIRS = ("testapigroup",)


class BuildError(RuntimeError):
    pass


def _log(message: str) -> None:
    print(f"protobuf-build: {message}", file=sys.stderr)


def repo_root() -> Path | None:
    """The source checkout this module runs from, if any (editable installs)."""
    root = HERE.parents[3]
    return root if (root / "pyproject.toml").is_file() else None


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    root = repo_root()
    if root is not None:
        return root / ".tools" / "cache" / "k8s-protobuf"
    cache_home = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache_home / "socialweb-computer" / "k8s-protobuf"


def builder_stamp(suite: str) -> str:
    """Changes whenever the builder's code or its inputs' names change."""
    digest = hashlib.sha256()
    for name in ("build.py", "protofile.py", "gotypes.py"):
        digest.update((HERE / name).read_bytes())
    digest.update(f"{FORMAT}|{suite}|{','.join(PACKAGES)}".encode())
    return digest.hexdigest()


def is_up_to_date(output: Path, stamp: str) -> bool:
    try:
        with output.open("rb") as f:
            return json.load(f).get("stamp") == stamp
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------- table

def _proto_files(root: Path) -> list[Path]:
    files = sorted((root / GO_SRC).rglob("generated.proto"))
    return [f for f in files if not any(part in SKIPPED_DIRS for part in f.parts)]


def _flags(go_field: gotypes.GoField | None) -> str:
    if go_field is None:
        return ""
    return "".join(flag for flag, on in (("p", go_field.pointer), ("e", go_field.omitempty),
                                          ("z", go_field.omitzero), ("i", go_field.inline)) if on)


def build_table(root: Path) -> tuple[dict, list[str]]:
    """Parses every generated.proto under an unpacked package tree; returns (table, warnings)."""
    warnings: list[str] = []
    parsed: list[tuple[Path, protofile.ProtoFile, gotypes.GoPackage]] = []
    for path in _proto_files(root):
        proto = protofile.parse(path.read_text(encoding="utf-8"))
        parsed.append((path, proto, gotypes.read_package(path.parent)))
    enums = {e for _, p, _ in parsed for e in p.enums}
    known = {m.full_name for _, p, _ in parsed for m in p.messages} | enums

    messages: dict[str, dict] = {}
    kinds: dict[str, dict[str, str]] = {}
    meta_kinds: dict[str, str] = {}
    for path, proto, go in parsed:
        for message in proto.messages:
            short = message.full_name[len(proto.package) + 1:]
            go_fields = go.structs.get(short, {})
            entry: dict = {"f": []}
            if short in go.slices:
                entry["go"] = "slice"
            elif short in go.maps:
                entry["go"] = "map"
            elif short not in go.structs:
                warnings.append(f"{message.full_name}: no Go struct found; JSON names taken from the .proto")
            for f in message.fields:
                go_field = go_fields.get(f.number)
                if go_field is None and go.structs.get(short) is not None:
                    warnings.append(f"{message.full_name}.{f.name} = {f.number}: no Go field has that number")
                name = _json_name(f, go_field)
                type_name = _resolved(f.type, message.full_name, known, enums)
                value_type = _resolved(f.value_type, message.full_name, known, enums) if f.value_type else ""
                label = {"optional": "", "repeated": "r", "map": "m"}[f.label]
                entry["f"].append([f.number, name, label, type_name, value_type, _flags(go_field)])
            messages[message.full_name] = entry
        _register_kinds(path, proto, go, kinds, meta_kinds)
    table = {"messages": messages, "kinds": kinds, "meta_kinds": meta_kinds}
    return table, warnings


def _json_name(proto_field: protofile.ProtoField, go_field: gotypes.GoField | None) -> str:
    """The Go json tag wins: go-to-protobuf mangles some names (`uID`, `aPIGroup`, `Webhooks`)."""
    if go_field is None or not (go_field.json_name or go_field.inline):
        return proto_field.name
    return "" if go_field.inline else go_field.json_name


def _resolved(type_name: str, scope: str, known: set[str], enums: set[str]) -> str:
    resolved = protofile.resolve_type(type_name, scope, known)
    return "int32" if resolved in enums else resolved


def _register_kinds(path: Path, proto: protofile.ProtoFile, go: gotypes.GoPackage,
                    kinds: dict[str, dict[str, str]], meta_kinds: dict[str, str]) -> None:
    """Records which kinds each group/version registers (from its register.go)."""
    if go.group_name is None:
        return
    version = path.parent.name
    names = {m.full_name[len(proto.package) + 1:] for m in proto.messages}
    registered = {k: f"{proto.package}.{k}" for k in go.known_types if k in names}
    if proto.package == "k8s.io.apimachinery.pkg.apis.meta.v1":
        meta_kinds.update(registered)
    group_version = f"{go.group_name}/{version}" if go.group_name else version
    kinds.setdefault(group_version, {}).update(registered)


def build_openapi_v2_table(root: Path) -> dict:
    """gnostic's openapi_v2 messages: name → [[number, name, label, type, oneof], ...] by number."""
    path = root / GNOSTIC_V2
    if not path.is_file():
        raise BuildError(f"{GNOSTIC_V2} is missing from the gnostic-models package")
    proto = protofile.parse(path.read_text(encoding="utf-8"))
    known = {m.full_name for m in proto.messages} | set(proto.enums) | {"google.protobuf.Any"}
    prefix = proto.package + "."
    messages = {}
    for message in proto.messages:
        fields = []
        for f in sorted(message.fields, key=lambda f: f.number):
            type_name = protofile.resolve_type(f.type, message.full_name, known)
            label = {"optional": "", "repeated": "r", "map": "m"}[f.label]
            fields.append([f.number, f.name, label, type_name.removeprefix(prefix), f.oneof])
        messages[message.full_name.removeprefix(prefix)] = fields
    return {"package": proto.package, "messages": messages}


def build(output: Path, cache: Path, suite: str, force: bool = False, refresh: bool = False) -> bool:
    """Returns True when it (re)wrote the table."""
    stamp = builder_stamp(suite)
    if not (force or refresh) and is_up_to_date(output, stamp):
        return False
    debs = debian.obtain(PACKAGES, suite, cache, refresh=refresh, log=_log)
    versions = {deb.name.split("_", 1)[0]: debian.deb_version(deb) for deb in debs}
    with tempfile.TemporaryDirectory(prefix="k8s-protobuf-") as tmp:
        for deb in debs:
            debian.extract(deb, Path(tmp))
        table, warnings = build_table(Path(tmp))
        table["openapi_v2"] = build_openapi_v2_table(Path(tmp))
    for warning in warnings:
        _log(f"note: {warning}")
    upstream = versions.get("golang-k8s-api-dev", "").split("-", 1)[0]
    table = {
        "format": FORMAT,
        "stamp": stamp,
        "source": {"suite": suite, "packages": versions, "kubernetes": _kubernetes_version(upstream)},
        **table,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = output.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(table, separators=(",", ":"), sort_keys=True))
    tmp_out.replace(output)
    _log(f"wrote {len(table['messages'])} messages from Kubernetes {table['source']['kubernetes']} "
         f"({', '.join(f'{k} {v}' for k, v in versions.items())})")
    return True


def _kubernetes_version(library_version: str) -> str:
    """k8s.io/api v0.X.Y is released together with Kubernetes v1.X.Y."""
    parts = library_version.split(".")
    return "1." + ".".join(parts[1:]) if len(parts) >= 2 and parts[0] == "0" else library_version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m socialweb_computer.apiserver.protobuf.build",
                                     description="Generate the Kubernetes protobuf field table.")
    parser.add_argument("--force", action="store_true", help="rebuild even if the table is up to date")
    parser.add_argument("--refresh", action="store_true", help="download the packages again, then rebuild")
    parser.add_argument("--suite", default=DEFAULT_SUITE, help="Debian suite to take the packages from")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where downloaded .deb files are kept")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    try:
        cache = args.cache_dir or default_cache_dir()
        wrote = build(args.output, cache, args.suite, args.force, args.refresh)
    except (BuildError, debian.ArchiveError, protofile.ProtoSyntaxError, OSError,
            subprocess.CalledProcessError) as exc:
        _log(f"error: {exc}")
        return 1
    if not wrote:
        _log(f"{args.output.name} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
