#!/usr/bin/env bash
# Builds dist/socialweb-computer: one executable file holding the Python interpreter, the
# package, its libraries and the data they read at run time, for a stock Debian 12 host that
# has no Python at all.  Writes dist/socialweb-computer.sha256 (sha256sum format) beside it
# and prints the digest.  docs/packaging.md says why PyInstaller (--onefile) and what is inside.
#
#   scripts/build-binary.sh                          # dist/socialweb-computer
#   scripts/build-binary.sh --dist DIR --work DIR    # elsewhere (the packaging tests do this)
#
# Needs: scripts/bootstrap.sh has run (the .venv, the generated protobuf table), binutils
# (objdump, which PyInstaller and the glibc check below use).  Installs the pinned PyInstaller
# into the .venv when it is missing or at another version; never touches anything else there.
#
# Steps: pinned PyInstaller -> build information (_build.json: commit, tree state, date) ->
# PyInstaller into the work directory -> checks (glibc symbol versions no newer than Debian 12's,
# the bundled data present, `version` run from an empty directory with an empty environment)
# -> only then copy into the dist directory and write the SHA-256.  A failed check leaves the
# previous dist/ untouched.
#
# Environment: SOURCE_DATE_EPOCH, when set, is the build date recorded instead of now.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

NAME="socialweb-computer"
VENV_PYTHON="$REPO_ROOT/.venv/bin/python"
# The bundler and everything it brings in, pinned; checked before each build.
BUILD_PINS=(pyinstaller==6.22.3 pyinstaller-hooks-contrib==2026.9 altgraph==0.17.5)
# Debian 12 (bookworm) ships glibc 2.36: no bundled object may need a newer symbol version.
MAX_GLIBC="2.36"
# Found by import analysis but never used by the program; each would add megabytes.
#   pydantic, pydantic_core: yarl's optional pydantic integration (probed with find_spec);
#   requests: jsonschema's optional fetching of remote $refs (kubernetes-validate never does);
#   kubernetes, pytest, _pytest: test extras in the .venv; the program must never import them.
EXCLUDED_MODULES=(pydantic pydantic_core requests kubernetes pytest _pytest)

DIST_DIR="$REPO_ROOT/dist"
WORK_DIR="$REPO_ROOT/build/binary"

log() { echo "build-binary: $*" >&2; }
die() { log "$*"; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

parse_args() {
    while (($#)); do
        case "$1" in
            --dist) DIST_DIR="$(realpath -m "${2:?--dist needs a directory}")"; shift 2 ;;
            --work) WORK_DIR="$(realpath -m "${2:?--work needs a directory}")"; shift 2 ;;
            -h | --help) usage; exit 0 ;;
            *) die "unknown argument: $1 (see --help)" ;;
        esac
    done
}

require_build_host() {
    [[ -x "$VENV_PYTHON" ]] || die ".venv is missing: run scripts/bootstrap.sh first"
    command -v objdump >/dev/null || die "objdump is missing: apt-get install binutils"
    # PyInstaller bundles libpython; an interpreter linked statically has none to bundle.
    "$VENV_PYTHON" -c 'import sys, sysconfig; sys.exit(not sysconfig.get_config_var("Py_ENABLE_SHARED"))' \
        || die "the .venv's Python was built without --enable-shared; PyInstaller needs libpython"
}

ensure_pyinstaller() {
    # Exit 0 when every pin is installed at its version, 1 otherwise.
    if "$VENV_PYTHON" - "${BUILD_PINS[@]}" <<'PY'; then return 0; fi
import sys
from importlib import metadata

for pin in sys.argv[1:]:
    name, version = pin.split("==")
    try:
        if metadata.version(name) != version:
            sys.exit(1)
    except metadata.PackageNotFoundError:
        sys.exit(1)
PY
    log "installing ${BUILD_PINS[*]} into .venv"
    "$VENV_PYTHON" -m pip install --quiet --disable-pip-version-check "${BUILD_PINS[@]}"
}

# Builds may start at once (the test suite runs on several workers, docs/testing.md): under this
# lock on the .venv one of them installs the pins while the others wait, then find them installed.
with_venv_lock() {
    local fd
    exec {fd}>"$REPO_ROOT/.venv/.build-binary.lock"
    flock "$fd"
    "$@"
    exec {fd}>&-
}

ensure_protobuf_table() {
    # Idempotent and offline once built (scripts/bootstrap.sh already ran it).
    "$VENV_PYTHON" -m socialweb_computer.apiserver.protobuf.build >/dev/null
}

git_commit() {
    git rev-parse HEAD 2>/dev/null || true
}

git_tree_state() {
    # --no-optional-locks: reading the state must not rewrite the index of a shared checkout.
    local changes
    changes="$(git --no-optional-locks status --porcelain --untracked-files=no 2>/dev/null)" \
        || { echo ""; return; }
    if [[ -n "$changes" ]]; then echo dirty; else echo clean; fi
}

build_date() {
    date -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}" +%Y-%m-%dT%H:%M:%SZ
}

write_build_info() {
    local out="$1"
    "$VENV_PYTHON" - "$out" "$(git_commit)" "$(git_tree_state)" "$(build_date)" <<'PY'
import sys
from importlib import metadata
from pathlib import Path

from socialweb_computer import binary

out, commit, tree_state, date = sys.argv[1:]
binary.stamp(Path(out), git_commit=commit, git_tree_state=tree_state, build_date=date,
             bundler=f"PyInstaller {metadata.version('pyinstaller')}")
PY
}

# `--add-data SRC:DEST` for data read at run time from outside our package: the one schema
# file schemas.py opens (kubernetes-validate ships every release, 100+ MB; we need 1.7 MB).
external_data_args() {
    "$VENV_PYTHON" - <<'PY'
import os

import kubernetes_validate

from socialweb_computer.apiserver import schemas

dest = f"kubernetes_validate/kubernetes-json-schema/{schemas.K8S_SCHEMA_VERSION}-local"
src = os.path.join(os.path.dirname(kubernetes_validate.__file__), os.path.relpath(dest, "kubernetes_validate"),
                   "_definitions.json")
if not os.path.isfile(src):
    raise SystemExit(f"missing {src}")
print(f"--add-data={src}:{dest}")
PY
}

run_pyinstaller() {
    local build_json="$1" out_dir="$2" args=() module line
    for module in "${EXCLUDED_MODULES[@]}"; do
        args+=("--exclude-module=$module")
    done
    while IFS= read -r line; do
        args+=("$line")
    done < <(external_data_args)
    # --collect-data: every non-Python file of our package (the generated protobuf table and
    # whatever else it reads at run time), the way pyproject's package-data ships them.
    # --collect-submodules: cli/main.py imports each command's module by name, when it runs.
    # --strip: libpython and friends carry debug sections; without them the file is 40 % smaller
    # and starts faster (less to unpack).  --noupx: never compress with UPX, even where installed.
    "$VENV_PYTHON" -m PyInstaller --onefile --name "$NAME" --noconfirm --clean --log-level WARN \
        --strip --noupx \
        --distpath "$out_dir" --workpath "$WORK_DIR/pyinstaller" --specpath "$WORK_DIR" \
        --paths "$REPO_ROOT/src" --collect-data socialweb_computer --collect-submodules socialweb_computer.cli \
        --add-data "$build_json:socialweb_computer" \
        "${args[@]}" "$REPO_ROOT/src/socialweb_computer/__main__.py"
}

# Reads PyInstaller's tables of contents of the bundle: checks the data files are in and no
# native object needs a glibc newer than Debian 12's, and writes contents.txt (KIND<tab>NAME).
check_contents() {
    local out_dir="$1"
    local toc_dir="$WORK_DIR/pyinstaller/$NAME"
    "$VENV_PYTHON" - "$toc_dir/PKG-00.toc" "$toc_dir/PYZ-00.toc" "$out_dir/$NAME" "$MAX_GLIBC" \
        "$WORK_DIR/contents.txt" <<'PY'
import ast
import re
import subprocess
import sys

pkg_toc, pyz_toc, bootloader, max_glibc, contents_path = sys.argv[1:]
# Each TOC is a Python literal; entries are (name in the bundle, source path, kind).
entries = ast.literal_eval(open(pkg_toc).read())[2]
modules = ast.literal_eval(open(pyz_toc).read())[1]
required = ("socialweb_computer/_build.json", "socialweb_computer/apiserver/protobuf/generated/fields.json",
            "kubernetes_validate/kubernetes-json-schema/")
names = [name for name, _, _ in entries]
for want in required:
    if not any(name.startswith(want) for name in names):
        sys.exit(f"the bundle lacks {want}")
binaries = [path for _, path, kind in entries if kind in ("BINARY", "EXTENSION")] + [bootloader]


def version_tuple(text):
    return tuple(int(part) for part in text.split("."))


worst = ("0", "")
for path in binaries:
    symbols = subprocess.run(["objdump", "-T", path], capture_output=True, text=True, check=True).stdout
    for found in set(re.findall(r"GLIBC_([0-9.]+)", symbols)):
        if version_tuple(found) > version_tuple(worst[0]):
            worst = (found, path)
if version_tuple(worst[0]) > version_tuple(max_glibc):
    sys.exit(f"{worst[1]} needs GLIBC_{worst[0]}, newer than {max_glibc} (Debian 12)")
with open(contents_path, "w") as out:
    out.write(f"# newest glibc symbol version needed: {worst[0]} ({worst[1].rsplit('/', 1)[-1]})\n")
    for name, _, kind in sorted(entries + modules, key=lambda e: (e[2], e[0])):
        if kind not in ("OPTION", "PYZ"):
            out.write(f"{kind}\t{name}\n")
print(f"glibc {worst[0]} at most; {len(binaries)} native objects", file=sys.stderr)
PY
}

# The binary must run from an empty directory with an empty environment: no venv, no source.
smoke_test() {
    local binary="$1" scratch output
    scratch="$(mktemp -d)"
    output="$(cd "$scratch" && env -i HOME="$scratch" PATH=/usr/bin:/bin TMPDIR="$scratch" "$binary" version)" \
        || { rm -rf "$scratch"; die "$binary version failed"; }
    rm -rf "$scratch"
    [[ "$output" == "$NAME "* && "$output" != *"build: source"* ]] \
        || die "unexpected output of $binary version: $output"
    printf '%s\n' "$output" >&2
}

main() {
    parse_args "$@"
    require_build_host
    with_venv_lock ensure_pyinstaller
    ensure_protobuf_table
    local started=$SECONDS out_dir="$WORK_DIR/out"
    rm -rf "$WORK_DIR"
    mkdir -p "$WORK_DIR" "$out_dir"
    write_build_info "$WORK_DIR/_build.json"
    log "running PyInstaller"
    run_pyinstaller "$WORK_DIR/_build.json" "$out_dir"
    check_contents "$out_dir"
    smoke_test "$out_dir/$NAME"
    mkdir -p "$DIST_DIR"
    # Copy then rename: a reader of dist/ never sees a half-written binary.
    cp "$out_dir/$NAME" "$DIST_DIR/.$NAME.tmp"
    mv -f "$DIST_DIR/.$NAME.tmp" "$DIST_DIR/$NAME"
    (cd "$DIST_DIR" && sha256sum "$NAME" >"$NAME.sha256")
    log "built $DIST_DIR/$NAME ($(du -h "$DIST_DIR/$NAME" | cut -f1), $((SECONDS - started))s)"
    cat "$DIST_DIR/$NAME.sha256"
}

main "$@"
