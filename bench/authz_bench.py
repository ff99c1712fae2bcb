"""SelfSubjectAccessReview latency with 1,000 RBAC rules loaded, against bootstrap rules only.

Why: every request is authorized before it reaches a handler, and `kubectl auth can-i` is an
SSAR, so the cost of RBAC evaluation is paid on every call; issue 3 asks that it stays flat
as a tenant's policy grows. The figure is the p99 of an SSAR POST (JSON, mTLS, keep-alive)
made by a non-admin user (system:masters would skip RBAC), first on a fresh cluster (bootstrap
policy only), then after 100 ClusterRoles x 10 rules (1,000 rules) bound by 100
ClusterRoleBindings to the caller's group. Every one of those rules applies to the caller, so
the denied review scans all 1,000 (the worst case); the allowed one matches the last role.
A third case binds the same 1,000 rules to other users, which the subject index skips.

    .venv/bin/python bench/authz_bench.py              # about 30 s
    .venv/bin/python bench/authz_bench.py --requests 500
"""

from __future__ import annotations

import datetime
import json
import ssl
import tempfile
from pathlib import Path

import common

from socialweb_computer import testing
from socialweb_computer.auth import pki

RBAC = "rbac.authorization.k8s.io"
SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
ROLES, RULES_PER_ROLE = 100, 10
GROUP = "bench"


def _user_context(server: testing.ApiServerProcess, directory: Path) -> ssl.SSLContext:
    """TLS as bench-user in group `bench`, with a certificate from the server's own ClientCA."""
    pki_dir = server.state_dir / "pki"
    ca = pki.KeyPair.load(str(pki_dir / "client-ca.crt"), str(pki_dir / "client-ca.key"))
    user = pki.new_client_cert(ca, "bench-user", (GROUP,), validity=datetime.timedelta(hours=1))
    user.save(str(directory / "user.crt"), str(directory / "user.key"))
    context = ssl.create_default_context(cafile=str(server.ca_file))
    context.load_cert_chain(str(directory / "user.crt"), str(directory / "user.key"))
    return context


def _ssar(verb: str, resource: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": "default",
                    "verb": verb,
                    "group": "bench.example.com",
                    "resource": resource,
                }
            },
        }
    ).encode()


def _policy(prefix: str, subject: dict[str, str]) -> list[tuple[str, dict[str, object]]]:
    objects: list[tuple[str, dict[str, object]]] = []
    for i in range(ROLES):
        rules = [
            {"apiGroups": ["bench.example.com"], "resources": [f"widgets{i}-{j}"], "verbs": ["get", "list"]}
            for j in range(RULES_PER_ROLE)
        ]
        objects.append(("clusterroles", {"metadata": {"name": f"{prefix}-{i:03d}"}, "rules": rules}))
        objects.append(
            (
                "clusterrolebindings",
                {
                    "metadata": {"name": f"{prefix}-{i:03d}"},
                    "subjects": [subject],
                    "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": f"{prefix}-{i:03d}"},
                },
            )
        )
    return objects


async def _load(session: object, url: str, objects: list[tuple[str, dict[str, object]]]) -> None:
    for plural, obj in objects:
        await common.fetch(session, "POST", f"{url}/apis/{RBAC}/v1/{plural}", json=obj)  # type: ignore[arg-type]


async def bench(load: common.Load) -> None:
    with (
        tempfile.TemporaryDirectory() as workdir,
        testing.ApiServerProcess.start(Path(workdir) / "state") as server,
    ):
        context = _user_context(server, Path(workdir))
        url = f"{server.url}{SSAR_PATH}"
        headers = {"Content-Type": "application/json"}
        last = f"widgets{ROLES - 1}-{RULES_PER_ROLE - 1}"
        async with (
            common.client_session(context) as user,
            common.client_session(server.ssl_context()) as admin,
        ):

            def review(body: bytes) -> common.RequestFn:
                return lambda: common.fetch(user, "POST", url, data=body, headers=headers)

            async with common.Baseline() as baseline:
                reference = await common.measure(common.BASELINE_NAME, baseline.request, load)
            results = [
                await common.measure("SSAR denied, bootstrap only", review(_ssar("delete", "gadgets")), load)
            ]
            await _load(
                admin, server.url, _policy("others", {"kind": "User", "apiGroup": RBAC, "name": "someone"})
            )
            results.append(
                await common.measure(
                    "SSAR denied, 1,000 rules of others", review(_ssar("delete", "gadgets")), load
                )
            )
            await _load(
                admin, server.url, _policy("bench", {"kind": "Group", "apiGroup": RBAC, "name": GROUP})
            )
            results.append(
                await common.measure(
                    "SSAR denied, 1,000 rules apply", review(_ssar("delete", "gadgets")), load
                )
            )
            results.append(
                await common.measure("SSAR allowed by rule 1,000", review(_ssar("get", last)), load)
            )
    print(f"\n{load.describe()}")
    print(common.format_table(results, reference))
    worst, base = results[2], results[0]
    print(
        f"\nSSAR p99: {base.p99 * 1000:.2f} ms with bootstrap rules only, {worst.p99 * 1000:.2f} ms with "
        "1,000 "
        f"rules applying to the caller ({worst.p99 / base.p99:.2f}x)"
    )


if __name__ == "__main__":
    common.main(bench, description=__doc__.splitlines()[0])
