#!/usr/bin/env bash
# The README's run command: install what is missing (scripts/bootstrap.sh), then run the
# gateway on the embedded default (SQLite) with cluster `ci` declared, state in ./state.
# Once it is ready it prints the admin kubeconfig, the tenant URL and the seed page's next
# commands; Ctrl-C stops it.
#
#   scripts/run.sh                                   # examples/gateway-spec.yaml, ./state
#   STATE_DIR=/var/tmp/kcp scripts/run.sh            # state on real disk elsewhere
#   GATEWAY_SPEC=my-spec.yaml scripts/run.sh         # another spec (docs/gateway.md)
#   STATE_DIR=./state-b API_PORT=8789 ADMIN_PORT=6442 CLUSTER_PORTS=7444-7643 scripts/run.sh
#                                                    # a second gateway beside the first
#
# API_PORT, ADMIN_PORT and CLUSTER_PORTS override the spec's listen.apiPort, listen.adminPort
# and listen.clusterPorts (the effective spec is written to $STATE_DIR/run-spec.yaml). Every
# credential the printed commands make goes under $STATE_DIR, never into the checkout.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
bash scripts/bootstrap.sh >&2
STATE_DIR="$(realpath -m "${STATE_DIR:-$REPO_ROOT/state}")"
GATEWAY_SPEC="$(realpath "${GATEWAY_SPEC:-$REPO_ROOT/examples/gateway-spec.yaml}")"
KUBECTL="$REPO_ROOT/.tools/bin/kubectl"
export PATH="$REPO_ROOT/.venv/bin:$REPO_ROOT/.tools/bin:$PATH"

if [[ -n "${API_PORT:-}${ADMIN_PORT:-}${CLUSTER_PORTS:-}" ]]; then
  mkdir -p "$STATE_DIR" && chmod 0700 "$STATE_DIR"
  effective="$STATE_DIR/run-spec.yaml"
  python - "$GATEWAY_SPEC" "$effective" <<'PY'
import os
import sys

import yaml

with open(sys.argv[1], encoding="utf-8") as f:
    spec = yaml.safe_load(f) or {}
listen = spec.setdefault("listen", {})
for variable, field, convert in (("API_PORT", "apiPort", int), ("ADMIN_PORT", "adminPort", int),
                                 ("CLUSTER_PORTS", "clusterPorts", str)):
    value = os.environ.get(variable, "")
    if value:
        try:
            listen[field] = convert(value)
        except ValueError:
            sys.exit(f"run.sh: {variable}={value!r} is not a port" + (" range" if convert is str else ""))
with open(sys.argv[2], "w", encoding="utf-8") as f:
    yaml.safe_dump(spec, f, sort_keys=False)
PY
  GATEWAY_SPEC="$effective"
fi

socialweb-computer gateway --state-dir "$STATE_DIR" --spec "$GATEWAY_SPEC" &
gateway=$!
trap 'kill -TERM "$gateway" 2>/dev/null || true; wait "$gateway"' INT TERM

# Ready = gateway.json names this process and its /readyz says ok.
api=""
for _ in $(seq 1 300); do
  if ! kill -0 "$gateway" 2>/dev/null; then wait "$gateway"; exit $?; fi
  api="$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["apiURL"] if d["pid"]==int(sys.argv[2]) else "")' \
        "$STATE_DIR/gateway.json" "$gateway" 2>/dev/null || true)"
  if [ -n "$api" ] && curl -fsS "$api/readyz" >/dev/null 2>&1; then break; fi
  sleep 0.1
done
admin="$STATE_DIR/admin.kubeconfig"
url="$("$KUBECTL" --kubeconfig "$admin" get cluster ci -o jsonpath='{.status.url}' 2>/dev/null || true)"
cat <<INFO

gateway ready: $api/api/config
dashboard: $api/   (or: socialweb-computer status --state-dir $STATE_DIR)
admin kubeconfig: $admin
tenant cluster ci: ${url:-"(not declared in $GATEWAY_SPEC)"}
tenant admin kubeconfig: $STATE_DIR/clusters/ci/admin.kubeconfig

next (docs/01-the-kcp-server.md):
  kubectl --kubeconfig $admin get clusters
  kubectl --kubeconfig $admin get cluster ci -o jsonpath='{.status.url}'
  SOCIALWEB_TENANTCREDENTIAL_STATE_DIR=$STATE_DIR SOCIALWEB_TENANTCREDENTIAL_CLUSTER=ci \\
  SOCIALWEB_TENANTCREDENTIAL_SERVER=$url \\
  SOCIALWEB_TENANTCREDENTIAL_COMMON_NAME=gitlab-runner SOCIALWEB_TENANTCREDENTIAL_ORGANIZATIONS=gitlab-runner \\
  SOCIALWEB_TENANTCREDENTIAL_OUT_DIR=$STATE_DIR/credentials/tenant-ci SOCIALWEB_TENANTCREDENTIAL_VALID_FOR=720h \\
  socialweb-computer internal tenantcredential
(kubectl 1.37 and socialweb-computer are in $REPO_ROOT/.tools/bin and $REPO_ROOT/.venv/bin)
INFO
wait "$gateway"
