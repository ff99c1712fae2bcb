"""`socialweb-computer internal ...`: operations meant for scripts, configured by environment.

`internal tenantcredential` is seed step 4: every setting is a SOCIALWEB_TENANTCREDENTIAL_*
variable, so a provisioning script can run it with nothing on the command line (and no
identity in `ps`). A refusal names the variable and how to fix it, and exits 1.
"""

from __future__ import annotations

import argparse
import os

from socialweb_computer import clusterprovider

PREFIX = "SOCIALWEB_TENANTCREDENTIAL_"
REQUIRED = ("STATE_DIR", "CLUSTER", "SERVER", "COMMON_NAME", "ORGANIZATIONS", "OUT_DIR")

_VARIABLES = """environment:
  SOCIALWEB_TENANTCREDENTIAL_STATE_DIR      the gateway's state directory
  SOCIALWEB_TENANTCREDENTIAL_CLUSTER        the Cluster's name, e.g. ci
  SOCIALWEB_TENANTCREDENTIAL_SERVER         its URL (kubectl get cluster ci -o jsonpath='{.status.url}')
  SOCIALWEB_TENANTCREDENTIAL_COMMON_NAME    the username, e.g. gitlab-runner
  SOCIALWEB_TENANTCREDENTIAL_ORGANIZATIONS  comma-separated groups, e.g. gitlab-runner
  SOCIALWEB_TENANTCREDENTIAL_OUT_DIR        where ca.crt, tls.crt, tls.key go (created if missing)
  SOCIALWEB_TENANTCREDENTIAL_VALID_FOR      optional Go duration, e.g. 720h (default: the ClientCA's
                                            remaining validity)
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "internal",
        help="operations for provisioning scripts, configured by environment",
        description="Operations for provisioning scripts, configured by environment variables.",
    )
    inner = p.add_subparsers(dest="internal_command", metavar="OPERATION")
    inner.required = True
    t = inner.add_parser(
        "tenantcredential",
        help="mint a runner's client certificate for one tenant cluster",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Sign a client certificate with the cluster's ClientCA from the state directory and "
        "write ca.crt (the cluster's serving CA), tls.crt and tls.key at mode 0600. It never "
        "overwrites a file, and refuses system:masters: the result is a scoped identity for RBAC.",
        epilog=_VARIABLES,
    )
    t.set_defaults(run=run_tenantcredential)
    w = inner.add_parser(
        "gateway-worker",
        help="serve tenant clusters for a gateway with `workers` above 1 (the gateway starts these)",
        description="One of the gateway's worker processes (docs/gateway.md, Workers): it serves the "
        "tenants the gateway hands it over the control socket it inherits, and exits when the "
        "gateway does. Not for running by hand.",
    )
    w.add_argument("--fd", type=int, required=True, help="the inherited control socket")
    w.add_argument("--parent", type=int, required=True, help="the gateway's process id")
    w.set_defaults(run=run_gateway_worker)


def run_gateway_worker(args: argparse.Namespace) -> int:
    import asyncio

    from socialweb_computer.gateway import workers

    asyncio.run(workers.serve(args.fd, args.parent))
    return 0


def run_tenantcredential(args: argparse.Namespace) -> int:
    from socialweb_computer.cli.main import CommandError

    env = {name: os.environ.get(PREFIX + name) for name in (*REQUIRED, "VALID_FOR")}
    for name in REQUIRED:
        if env[name] is None:
            raise CommandError(
                f"{PREFIX}{name} is not set. Set every variable listed in "
                "`socialweb-computer internal tenantcredential --help`."
            )
    valid_for = None
    if env["VALID_FOR"]:
        try:
            valid_for = clusterprovider.parse_go_duration(env["VALID_FOR"])
        except ValueError:
            raise CommandError(
                f"{PREFIX}VALID_FOR: {env['VALID_FOR']!r} is not a duration. Use Go's syntax, "
                "for example 720h or 24h30m, or leave it unset."
            ) from None
    try:
        credential = clusterprovider.mint_tenant_credential_for_cluster_as(
            state_dir=env["STATE_DIR"] or "",
            cluster=env["CLUSTER"] or "",
            server=env["SERVER"] or "",
            common_name=env["COMMON_NAME"] or "",
            organizations=_groups(env["ORGANIZATIONS"] or ""),
            out_dir=env["OUT_DIR"] or "",
            valid_for=valid_for,
        )
    except clusterprovider.CredentialRefused as e:
        raise CommandError(f"{PREFIX}{e.setting}: {e.problem}. {e.fix}.") from None
    print(
        f"wrote {credential.ca_crt}, {credential.tls_crt}, {credential.tls_key} for "
        f"CN={credential.common_name} O={','.join(credential.organizations)} on {credential.server}, "
        f"valid until {credential.not_after:%Y-%m-%dT%H:%M:%SZ}"
    )
    return 0


def _groups(value: str) -> tuple[str, ...]:
    return tuple(value.split(",")) if value.strip() else ()
