#!/usr/bin/env bash
# The README's run command: install what is missing (scripts/bootstrap.sh), then serve one
# Kubernetes API on loopback with its state (SQLite, CAs, admin kubeconfig) in ./state.
#
#   scripts/run.sh                       # https://127.0.0.1:6443, state in ./state
#   scripts/run.sh --port 0              # any free port; the kubeconfig names it
#   STATE_DIR=/var/tmp/kcp scripts/run.sh
#
# Extra arguments go to `socialweb-computer apiserver` (see its --help).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
bash scripts/bootstrap.sh
echo "run.sh: kubectl 1.37 is at $REPO_ROOT/.tools/bin/kubectl" >&2
exec "$REPO_ROOT/.venv/bin/socialweb-computer" apiserver --state-dir "${STATE_DIR:-$REPO_ROOT/state}" "$@"
