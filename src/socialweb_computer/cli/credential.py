"""`socialweb-computer credential`: `mint` (the tenant credential, with flags and an optional
kubeconfig) and `rotate-service-account-key` (a cluster's token signing keys, auth.tokens).

`mint` is the same operation as `internal tenantcredential` (clusterprovider), friendlier for a
person at a shell: the server defaults to the cluster's own URL, and `--kubeconfig`
also writes a ready kubeconfig (0600) that embeds the three files.
"""

from __future__ import annotations

import argparse
import os

from socialweb_computer import clusterprovider
from socialweb_computer.auth import kubeconfig
from socialweb_computer.clusterprovider import layout

_FLAGS = {
    "STATE_DIR": "--state-dir",
    "CLUSTER": "--cluster",
    "SERVER": "--server",
    "COMMON_NAME": "--user",
    "ORGANIZATIONS": "--group",
    "OUT_DIR": "--out-dir",
    "VALID_FOR": "--valid-for",
}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "credential",
        help="client certificates for tenant clusters",
        description="Client certificates for tenant clusters.",
    )
    inner = p.add_subparsers(dest="credential_command", metavar="OPERATION")
    inner.required = True
    m = inner.add_parser(
        "mint",
        help="mint a scoped client certificate (and optionally a kubeconfig) for a tenant cluster",
        description="Sign a client certificate with the cluster's ClientCA and write ca.crt, tls.crt and "
        "tls.key (0600) to --out-dir; with --kubeconfig also a kubeconfig embedding them. Refuses "
        "to overwrite and refuses system:masters.",
    )
    m.add_argument(
        "--state-dir",
        default=os.environ.get("SOCIALWEB_GATEWAY_STATE_DIR"),
        help="the gateway's state directory (default: $SOCIALWEB_GATEWAY_STATE_DIR)",
    )
    m.add_argument("--cluster", required=True, help="the Cluster's name")
    who = m.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", help="the username (certificate CommonName)")
    who.add_argument(
        "--node",
        help="a node agent's credential instead: user system:node:NODE in group system:nodes, held to "
        "the Node authorizer and NodeRestriction",
    )
    m.add_argument(
        "--group", action="append", default=[], help="a group (certificate Organization); repeat for several"
    )
    m.add_argument(
        "--out-dir", required=True, help="directory for ca.crt, tls.crt, tls.key (created if missing)"
    )
    m.add_argument("--server", help="the URL the credential is for (default: the cluster's URL)")
    m.add_argument(
        "--valid-for", help="Go duration such as 720h (default: the ClientCA's remaining validity)"
    )
    m.add_argument(
        "--kubeconfig", metavar="FILE", help="also write a kubeconfig using the credential to FILE"
    )
    m.set_defaults(run=run_mint)
    r = inner.add_parser(
        "rotate-service-account-key",
        help="make a new key sign a cluster's ServiceAccount tokens (the old ones keep verifying)",
        description="Add a new ServiceAccount signing key to a cluster's state; it signs every token "
        "issued from then on, and a running gateway or apiserver picks it up within a request. Tokens "
        "signed by the earlier keys stay valid, because those keys keep verifying (and stay in the "
        "JWKS document) until you pass --retire, which removes every key but the newest: tokens "
        "they signed, including legacy Secret tokens, then get 401.",
    )
    r.add_argument(
        "--state-dir",
        default=os.environ.get("SOCIALWEB_GATEWAY_STATE_DIR"),
        help="the gateway's (or a development apiserver's) state directory "
        "(default: $SOCIALWEB_GATEWAY_STATE_DIR)",
    )
    r.add_argument(
        "--cluster", help="a tenant Cluster's name; without it, the state directory's own plane "
        "(the gateway's admin plane, or a development apiserver)"
    )
    r.add_argument("--retire", action="store_true",
                   help="instead of adding a key, remove all keys but the newest")
    r.set_defaults(run=run_rotate)


def run_mint(args: argparse.Namespace) -> int:
    from socialweb_computer.cli.main import CommandError

    if not args.state_dir:
        raise CommandError("no state directory: pass --state-dir (the gateway's --state-dir)")
    if args.kubeconfig and os.path.lexists(args.kubeconfig):
        raise CommandError(
            f"--kubeconfig: {args.kubeconfig} already exists; nothing was written. Move it aside "
            "or choose another path."
        )
    server = args.server
    if server is None:
        record = layout.StateLayout(args.state_dir).read_cluster(args.cluster)
        server = record.url if record is not None else ""
    try:
        valid_for = clusterprovider.parse_go_duration(args.valid_for) if args.valid_for else None
    except ValueError:
        raise CommandError(
            f"--valid-for: {args.valid_for!r} is not a duration; use Go's syntax, e.g. 720h"
        ) from None
    if args.node is not None and args.group:
        raise CommandError("--group: a node's credential has exactly the group system:nodes; drop --group "
                           "or use --user")
    try:
        if args.node is not None:
            credential = clusterprovider.mint_node_credential_for_cluster(
                state_dir=args.state_dir,
                cluster=args.cluster,
                server=server,
                node=args.node,
                out_dir=args.out_dir,
                valid_for=valid_for,
            )
        else:
            credential = clusterprovider.mint_tenant_credential_for_cluster_as(
                state_dir=args.state_dir,
                cluster=args.cluster,
                server=server,
                common_name=args.user,
                organizations=tuple(args.group),
                out_dir=args.out_dir,
                valid_for=valid_for,
            )
    except clusterprovider.CredentialRefused as e:
        flag = "--node" if args.node is not None and e.setting == "COMMON_NAME" else _FLAGS[e.setting]
        raise CommandError(f"{flag}: {e.problem}. {e.fix}.") from None
    print(f"wrote {credential.ca_crt}, {credential.tls_crt}, {credential.tls_key}")
    if args.kubeconfig:
        with (
            open(credential.ca_crt, "rb") as ca,
            open(credential.tls_crt, "rb") as crt,
            open(credential.tls_key, "rb") as key,
        ):
            kubeconfig.write(
                args.kubeconfig,
                cluster=args.cluster,
                server=credential.server,
                ca_pem=ca.read(),
                user=credential.common_name,
                cert_pem=crt.read(),
                key_pem=key.read(),
            )
        print(f"wrote {args.kubeconfig}: kubectl --kubeconfig {args.kubeconfig} get pods -n <namespace>")
    return 0


def run_rotate(args: argparse.Namespace) -> int:
    from socialweb_computer.cli.main import CommandError

    if not args.state_dir:
        raise CommandError("no state directory: pass --state-dir (the gateway's --state-dir)")
    state = layout.StateLayout(args.state_dir)
    if args.cluster:
        if state.read_cluster(args.cluster) is None:
            known = ", ".join(state.cluster_names()) or "none"
            raise CommandError(f"--cluster: no cluster {args.cluster!r} in {state.root} (clusters there: "
                               f"{known}). Use a name from `kubectl get clusters` on the admin plane.")
        plane = state.cluster_pki(args.cluster)
    else:
        plane = state.admin_pki
    if not os.path.isdir(plane.directory):
        raise CommandError(f"--state-dir: {plane.directory} does not exist; pass the state directory of a "
                           "gateway or apiserver that has started at least once.")
    keys = plane.token_keys()
    if args.retire:
        retired = keys.retire()
        print(f"retired {len(retired)} key(s); {keys.signing_key.kid} signs and alone verifies")
        return 0
    key = keys.rotate()
    print(f"new signing key {key.kid}; {len(keys.keys()) - 1} earlier key(s) keep verifying")
    return 0
