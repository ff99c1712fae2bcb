#!/usr/bin/env bash
# Deploys the socialweb-computer gateway to its service account over ssh (seed 01, step 1):
# `socialweb-computer install gateway` the first time, `socialweb-computer upgrade` after, both
# run by the uploaded binary on the target, and both waiting there until the gateway's new
# process answers /api/config.  docs/host-operations.md has the details.
#
#   BINARY=dist/socialweb-computer SHA256=<hex> SSH_KEY=~/.ssh/id_ed25519_no_password \
#   GATEWAY_ENV_FILE=~/.tmp/deploy/gateway.env GATEWAY_SPEC_FILE=~/.tmp/deploy/gateway-spec.yaml \
#   scripts/deploy.sh
#
# Required:
#   BINARY             the single-file binary to deploy (scripts/build-binary.sh)
#   SHA256             its SHA-256, 64 hex digits (first field of dist/socialweb-computer.sha256)
#   SSH_KEY            private key that logs in as the service account (no passphrase: BatchMode)
#   GATEWAY_ENV_FILE   the unit's environment file (NAME=value; secrets); never printed
#   GATEWAY_SPEC_FILE  the gateway spec (docs/gateway.md)
# Optional:
#   SSH_TARGET         [user@]host; default socialweb@localhost, user defaults to socialweb
#   SSH_PORT           ssh port (default: ssh's own, normally 22)
#   SSH_KNOWN_HOSTS    known_hosts file that pins the host key (StrictHostKeyChecking=yes);
#                      without it a first-seen key is recorded and a changed one refused
#                      (StrictHostKeyChecking=accept-new), since BatchMode cannot ask
#   WAIT_TIMEOUT       seconds the gateway gets to answer /api/config (default 60)
#
# Order: every variable, file and the local SHA-256 are checked before any connection; then
# one ssh connection (a control master, so the key is used once) carries everything: a private
# temporary directory in the account's ~/.cache, the three uploads (umask 077; the env file is
# streamed, never read into this script), the SHA-256 checked again on the target, install or
# upgrade, and the temporary directory removed.  Exit status 0 when the gateway answers, 1 at
# the first failure with what failed and what to do.
set -euo pipefail

readonly NAME=socialweb-computer
readonly UNIT=socialweb-computer-gateway.service
# The stable path and the unit as hostops/layout.py lays them out, relative to the home.
readonly REMOTE_STABLE=".local/bin/$NAME"
readonly REMOTE_UNIT=".config/systemd/user/$UNIT"
readonly REQUIRED=(BINARY SHA256 SSH_KEY GATEWAY_ENV_FILE GATEWAY_SPEC_FILE)
declare -rA PURPOSE=(
    [BINARY]="the socialweb-computer binary to deploy (scripts/build-binary.sh writes dist/$NAME)"
    [SHA256]="the binary's SHA-256 (the first field of dist/$NAME.sha256)"
    [SSH_KEY]="the private key that logs in as the service account"
    [GATEWAY_ENV_FILE]="the gateway's environment file (NAME=value lines)"
    [GATEWAY_SPEC_FILE]="the gateway spec (docs/gateway.md)"
)

LOCAL_TMP=""
REMOTE_TMP=""
TARGET=""
SSH=()

say() { printf 'deploy: %s\n' "$*"; }
die() {
    printf 'deploy: error: %s\n' "$*" >&2
    exit 1
}

# `~/x` as written in the seed, when the shell did not expand it (quoted).
expand_home() {
    # shellcheck disable=SC2088  # a literal tilde is what is matched
    case "$1" in
        "~/"*) printf '%s\n' "$HOME/${1#\~/}" ;;
        *) printf '%s\n' "$1" ;;
    esac
}

check_variables() {
    local name
    for name in "${REQUIRED[@]}"; do
        [[ -n "${!name:-}" ]] || die "$name is not set: it names ${PURPOSE[$name]}"
    done
    for name in BINARY SSH_KEY GATEWAY_ENV_FILE GATEWAY_SPEC_FILE; do
        printf -v "$name" '%s' "$(expand_home "${!name}")"
        [[ -f "${!name}" ]] || die "$name=${!name}: no such file (${PURPOSE[$name]})"
        [[ -r "${!name}" ]] || die "$name=${!name}: not readable by $(id -un)"
    done
    [[ "$SHA256" =~ ^[0-9a-fA-F]{64}$ ]] \
        || die "SHA256 is not 64 hex digits: it must be ${PURPOSE[SHA256]}"
    SHA256="${SHA256,,}"
    # ssh ignores a private key others can read; say so here rather than as "Permission denied".
    (( (8#$(stat -c %a "$SSH_KEY")) & 8#077 )) \
        && die "SSH_KEY=$SSH_KEY is readable by other users, so ssh refuses it: chmod 600 it"
    WAIT_TIMEOUT="${WAIT_TIMEOUT:-60}"
    [[ "$WAIT_TIMEOUT" =~ ^[0-9]+$ ]] || die "WAIT_TIMEOUT must be a number of seconds"
    [[ -z "${SSH_PORT:-}" || "$SSH_PORT" =~ ^[0-9]+$ ]] || die "SSH_PORT must be a port number"
    if [[ -n "${SSH_KNOWN_HOSTS:-}" ]]; then
        SSH_KNOWN_HOSTS="$(expand_home "$SSH_KNOWN_HOSTS")"
        [[ -r "$SSH_KNOWN_HOSTS" ]] || die "SSH_KNOWN_HOSTS=$SSH_KNOWN_HOSTS: no such readable file"
    fi
    TARGET="${SSH_TARGET:-socialweb@localhost}"
    [[ "$TARGET" == *@* ]] || TARGET="socialweb@$TARGET"
}

check_sha256() {
    local actual
    # shellcheck disable=SC2153  # BINARY comes from the environment
    actual="$(sha256sum -- "$BINARY" | cut -d' ' -f1)"
    [[ "$actual" == "$SHA256" ]] \
        || die "BINARY=$BINARY has SHA-256 $actual, not SHA256=$SHA256: refusing it (nothing was uploaded)"
    say "checked $BINARY: sha256 $SHA256"
}

setup_ssh() {
    LOCAL_TMP="$(mktemp -d "${TMPDIR:-/tmp}/deploy.XXXXXX")"
    SSH=(ssh -i "$SSH_KEY" -o BatchMode=yes -o IdentitiesOnly=yes -o ConnectTimeout=15
        -o ServerAliveInterval=15 -o LogLevel=ERROR -o ControlPath="$LOCAL_TMP/control")
    if [[ -n "${SSH_KNOWN_HOSTS:-}" ]]; then
        SSH+=(-o UserKnownHostsFile="$SSH_KNOWN_HOSTS" -o StrictHostKeyChecking=yes)
    else
        SSH+=(-o StrictHostKeyChecking=accept-new)
    fi
    [[ -z "${SSH_PORT:-}" ]] || SSH+=(-p "$SSH_PORT")
}

connect() {
    "${SSH[@]}" -o ControlMaster=yes -o ControlPersist=yes -f -N "$TARGET" </dev/null \
        || die "cannot log in to $TARGET${SSH_PORT:+ port $SSH_PORT} with SSH_KEY=$SSH_KEY (ssh's reason is" \
               "above): is its public key in the account's ~/.ssh/authorized_keys, and the host key known?"
    say "connected to $TARGET${SSH_PORT:+ port $SSH_PORT}"
}

# Runs a shell command line on the target through the control master.
remote() {
    "${SSH[@]}" -o ControlMaster=no "$TARGET" -- "$1"
}

quote() { printf '%q' "$1"; }

cleanup() {
    local status=$?
    if [[ -n "$REMOTE_TMP" ]]; then
        remote "rm -rf $(quote "$REMOTE_TMP")" || say "warning: could not remove $REMOTE_TMP on $TARGET"
    fi
    if [[ -n "$LOCAL_TMP" ]]; then
        [[ ! -S "$LOCAL_TMP/control" ]] || "${SSH[@]}" -O exit "$TARGET" 2>/dev/null || true
        rm -rf "$LOCAL_TMP"
    fi
    exit "$status"
}

make_remote_tmp() {
    # shellcheck disable=SC2016  # $HOME is expanded on the target
    REMOTE_TMP="$(remote 'umask 077 && mkdir -p "$HOME/.cache/socialweb-computer" &&
        mktemp -d "$HOME/.cache/socialweb-computer/deploy.XXXXXX"')" \
        || die "cannot create a temporary directory in ~/.cache on $TARGET"
    [[ "$REMOTE_TMP" == /* ]] || die "unexpected answer from mktemp on $TARGET: $REMOTE_TMP"
}

# upload LOCAL NAME MODE: streams the file through ssh; umask 077 keeps it private while written.
upload() {
    local destination="$REMOTE_TMP/$2"
    remote "umask 077 && cat >$(quote "$destination") && chmod $3 $(quote "$destination")" <"$1" \
        || die "uploading $1 to $TARGET:$destination failed"
}

upload_all() {
    upload "$BINARY" "$NAME" 700
    upload "$GATEWAY_ENV_FILE" gateway.env 600
    upload "$GATEWAY_SPEC_FILE" gateway-spec.yaml 600
    local uploaded
    uploaded="$(remote "sha256sum $(quote "$REMOTE_TMP/$NAME")" | cut -d' ' -f1)" \
        || die "cannot compute the uploaded binary's SHA-256 on $TARGET"
    [[ "$uploaded" == "$SHA256" ]] \
        || die "the binary arrived on $TARGET with SHA-256 $uploaded, not $SHA256 (a broken upload)"
    say "uploaded the binary (sha256 verified on $TARGET), the environment file and the spec to $REMOTE_TMP"
}

# install the first time, upgrade after: the same marks `install gateway` refuses on.
choose_action() {
    local status=0
    remote "test -e ~/$REMOTE_STABLE || test -L ~/$REMOTE_STABLE || test -e ~/$REMOTE_UNIT" || status=$?
    case "$status" in
        0) printf 'upgrade\n' ;;
        1) printf 'install gateway\n' ;;
        *) die "cannot tell whether the gateway is installed on $TARGET (ssh exit status $status)" ;;
    esac
}

run_action() {
    local action="$1" binary="$REMOTE_TMP/$NAME" status=0
    say "running \`$NAME $action\` on $TARGET (it waits until /api/config answers, at most ${WAIT_TIMEOUT}s)"
    remote "$(quote "$binary") $action --binary $(quote "$binary") --sha256 $SHA256 \
        --env-file $(quote "$REMOTE_TMP/gateway.env") --spec-file $(quote "$REMOTE_TMP/gateway-spec.yaml") \
        --timeout $WAIT_TIMEOUT" || status=$?
    ((status == 0)) && return 0
    ((status == 255)) && die "the ssh connection to $TARGET failed while \`$NAME $action\` ran"
    die "\`$NAME $action\` failed on $TARGET (exit status $status); its message is above"
}

main() {
    check_variables
    check_sha256
    setup_ssh
    trap cleanup EXIT
    connect
    make_remote_tmp
    upload_all
    local action
    action="$(choose_action)"
    run_action "$action"
    case "$action" in
        upgrade) say "done: upgraded the gateway on $TARGET to sha256 ${SHA256:0:12}; it answers /api/config" ;;
        *) say "done: installed the gateway on $TARGET (sha256 ${SHA256:0:12}); it answers /api/config" ;;
    esac
}

main "$@"
