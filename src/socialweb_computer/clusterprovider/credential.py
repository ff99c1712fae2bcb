"""Minting a scoped client certificate for one tenant cluster, signed by its ClientCA on disk.

This is the only way to a scoped identity: it signs directly with the cluster's ClientCA
from the state directory, so the CommonName becomes the username and the Organizations
the groups, and the certificate is accepted by that cluster's listener and no other.
The callers are `socialweb-computer internal tenantcredential` (seed step 4, configured by
environment variables), `socialweb-computer credential mint` and Python code;
`mint_node_credential_for_cluster` is the same for a node agent's identity, and
`mint_proxy_credential_for_cluster` for the kube-proxy identity its Services part uses.

Every refusal is a `CredentialRefused` naming the setting at fault, so each caller can
say it in its own words (an environment variable, a flag). Nothing is written unless all
three files can be written: they appear together or not at all.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re

from socialweb_computer.api import objects
from socialweb_computer.auth import pki
from socialweb_computer.clusterprovider import layout

SUPERUSER_GROUP = "system:masters"
# A kubelet's identity, as the Node authorizer and NodeRestriction recognise it
# (auth.nodeauthorizer.NODE_USER_PREFIX and NODES_GROUP).
NODE_USER_PREFIX, NODES_GROUP = "system:node:", "system:nodes"
# kube-proxy's identity, bound to the ClusterRole system:node-proxier (auth.bootstrap).
PROXY_USER = "system:kube-proxy"
FILES = ("ca.crt", "tls.crt", "tls.key")

# Go's time.ParseDuration units. Written by hand: no maintained Python library parses Go
# durations, and the grammar is one regular expression.
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class CredentialRefused(ValueError):
    """`setting` is one of STATE_DIR, CLUSTER, SERVER, COMMON_NAME, ORGANIZATIONS, OUT_DIR, VALID_FOR."""

    def __init__(self, setting: str, problem: str, fix: str) -> None:
        super().__init__(f"{setting}: {problem}. {fix}")
        self.setting = setting
        self.problem = problem
        self.fix = fix


@dataclasses.dataclass(frozen=True)
class TenantCredential:
    cluster: str
    server: str
    common_name: str
    organizations: tuple[str, ...]
    not_after: datetime.datetime
    ca_crt: str
    tls_crt: str
    tls_key: str


def parse_go_duration(text: str) -> datetime.timedelta:
    """`720h`, `1h30m`, `90m`, `1.5h`: Go's duration syntax, without a sign (a validity is positive)."""
    value = text.strip()
    if value == "0":
        return datetime.timedelta(0)
    position, seconds = 0, 0.0
    while position < len(value):
        match = _DURATION.match(value, position)
        if match is None:
            raise ValueError(f"invalid duration {text!r}")
        seconds += float(match[1]) * _UNITS[match[2]]
        position = match.end()
    if not value:
        raise ValueError("invalid duration ''")
    return datetime.timedelta(seconds=seconds)


def mint_tenant_credential_for_cluster_as(
    *,
    state_dir: str,
    cluster: str,
    server: str,
    common_name: str,
    organizations: tuple[str, ...] | list[str],
    out_dir: str,
    valid_for: datetime.timedelta | None = None,
) -> TenantCredential:
    """Sign `common_name`/`organizations` with `cluster`'s ClientCA; write ca.crt, tls.crt, tls.key (0600).

    `server` must be the cluster's URL (what the credential will be used against). `valid_for`
    defaults to the ClientCA's remaining validity and may not exceed it.
    """
    record, plane = _cluster(state_dir, cluster)
    _check_server(record, server)
    groups = _check_identity(common_name, tuple(organizations))
    client_ca = pki.KeyPair.load(plane.client_ca, plane.client_ca_key)
    validity = _check_validity(client_ca, valid_for)
    targets = _check_out_dir(out_dir)
    pair = pki.new_client_cert(client_ca, common_name, groups, validity=validity)
    with open(plane.serving_ca, "rb") as f:
        serving_ca = f.read()
    _write_together(out_dir, dict(zip(FILES, (serving_ca, pair.cert_pem, pair.key_pem), strict=True)))
    return TenantCredential(
        cluster=cluster,
        server=record.url,
        common_name=common_name,
        organizations=groups,
        not_after=pair.cert.not_valid_after_utc,
        ca_crt=targets[0],
        tls_crt=targets[1],
        tls_key=targets[2],
    )


def mint_node_credential_for_cluster(
    *,
    state_dir: str,
    cluster: str,
    server: str,
    node: str,
    out_dir: str,
    valid_for: datetime.timedelta | None = None,
) -> TenantCredential:
    """The credential of node `node`: `system:node:<node>` in `system:nodes`, for its agent.

    What it may do is decided by the Node authorizer and NodeRestriction (docs/auth.md): its
    own Node and Lease, the pods bound to it and what they reference.
    """
    problems = objects.dns1123_subdomain_errors(node) if node else ["it is empty"]
    if problems:
        raise CredentialRefused(
            "COMMON_NAME",
            f"{node!r} cannot name a Node: {'; '.join(problems)}",
            "Use a lower-case DNS subdomain, for example ci-node-1",
        )
    return mint_tenant_credential_for_cluster_as(
        state_dir=state_dir,
        cluster=cluster,
        server=server,
        common_name=NODE_USER_PREFIX + node,
        organizations=(NODES_GROUP,),
        out_dir=out_dir,
        valid_for=valid_for,
    )


def mint_proxy_credential_for_cluster(
    *, state_dir: str, cluster: str, server: str, out_dir: str, valid_for: datetime.timedelta | None = None
) -> TenantCredential:
    """kube-proxy's credential (`system:kube-proxy`), for a node agent's Services and cluster DNS:
    it lists and watches Services and EndpointSlices, which a node's own identity may not."""
    return mint_tenant_credential_for_cluster_as(
        state_dir=state_dir,
        cluster=cluster,
        server=server,
        common_name=PROXY_USER,
        organizations=(),
        out_dir=out_dir,
        valid_for=valid_for,
    )


def _cluster(state_dir: str, name: str) -> tuple[layout.ClusterRecord, layout.PlanePki]:
    if not state_dir:
        raise CredentialRefused(
            "STATE_DIR",
            "is empty",
            "Set it to the gateway's state directory (its --state-dir, the directory holding gateway.json)",
        )
    state = layout.StateLayout(state_dir)
    if not os.path.isdir(state.root):
        raise CredentialRefused(
            "STATE_DIR",
            f"{state.root} is not a directory",
            "Set it to the gateway's state directory (the one holding gateway.json)",
        )
    if not name:
        raise CredentialRefused(
            "CLUSTER",
            "is empty",
            "Set it to the name of a Cluster (kubectl --kubeconfig <admin kubeconfig> get clusters)",
        )
    record = state.read_cluster(name)
    if record is None:
        known = ", ".join(state.cluster_names()) or "none"
        raise CredentialRefused(
            "CLUSTER",
            f"no cluster {name!r} in {state.root} (clusters there: {known})",
            "Use a name from `kubectl --kubeconfig <admin kubeconfig> get clusters`, or "
            "check that STATE_DIR is the gateway's state directory",
        )
    return record, state.cluster_pki(name)


def _check_server(record: layout.ClusterRecord, server: str) -> None:
    if server.rstrip("/") != record.url:
        shown = repr(server) if server else "empty"
        raise CredentialRefused(
            "SERVER",
            f"is {shown}, but cluster {record.name!r} is served at {record.url}; a credential is "
            "valid only against the cluster whose ClientCA signs it",
            f"Set it to {record.url} (kubectl --kubeconfig <admin kubeconfig> get cluster {record.name} "
            "-o jsonpath='{.status.url}')",
        )


def _check_identity(common_name: str, organizations: tuple[str, ...]) -> tuple[str, ...]:
    if not common_name.strip():
        raise CredentialRefused(
            "COMMON_NAME",
            "is empty; the CommonName is the username RBAC sees",
            "Set it to the runner's user name, for example gitlab-runner",
        )
    groups = tuple(o.strip() for o in organizations)
    if any(not g for g in groups):
        raise CredentialRefused(
            "ORGANIZATIONS",
            f"{','.join(organizations)!r} has an empty entry",
            "Give a comma-separated list of group names without empty items, for example gitlab-runner",
        )
    if SUPERUSER_GROUP in groups:
        raise CredentialRefused(
            "ORGANIZATIONS",
            f"contains {SUPERUSER_GROUP}, the superuser group that bypasses every RBAC rule; "
            "a scoped credential never carries it",
            "Use the group your ClusterRoleBinding names (for example gitlab-runner); the operator's own "
            "superuser kubeconfig is clusters/<name>/admin.kubeconfig in the state directory",
        )
    return groups


def _check_validity(client_ca: pki.KeyPair, valid_for: datetime.timedelta | None) -> datetime.timedelta:
    remaining = client_ca.cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    if valid_for is None:
        return remaining
    if valid_for <= datetime.timedelta(0):
        raise CredentialRefused(
            "VALID_FOR",
            f"{_hours(valid_for)} is not a positive duration",
            "Give a Go duration such as 720h, or leave it unset for the ClientCA's validity",
        )
    if valid_for > remaining:
        raise CredentialRefused(
            "VALID_FOR",
            f"{_hours(valid_for)} is longer than the cluster's ClientCA remains valid "
            f"({_hours(remaining)}, until {client_ca.cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ})",
            "Ask for less, or leave it unset to get the ClientCA's remaining validity",
        )
    return valid_for


def _hours(delta: datetime.timedelta) -> str:
    return f"{delta.total_seconds() / 3600:g}h"


def _check_out_dir(out_dir: str) -> list[str]:
    if not out_dir:
        raise CredentialRefused(
            "OUT_DIR",
            "is empty",
            "Set it to the directory the three files go to, for example /etc/gitlab-runner/tenant-ci",
        )
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CredentialRefused(
            "OUT_DIR", f"{out_dir} exists and is not a directory", "Choose a directory path"
        )
    targets = [os.path.join(out_dir, f) for f in FILES]
    existing = [t for t in targets if os.path.lexists(t)]
    if existing:
        raise CredentialRefused(
            "OUT_DIR",
            f"{', '.join(existing)} already exist(s); nothing was written",
            "To rotate, move the old files aside first (the tool never overwrites)",
        )
    return targets


def _write_together(out_dir: str, files: dict[str, bytes]) -> None:
    """Write each file at 0600 under a scratch name, then link all into place; undo on any failure.

    link() refuses an existing name, so a file that appeared since the check is never replaced.
    """
    scratch: list[str] = []
    placed: list[str] = []
    try:
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
        for name, data in files.items():
            tmp = os.path.join(out_dir, f".{name}.{os.getpid()}.tmp")
            pki.write_private(tmp, data)
            scratch.append(tmp)
        for tmp, name in zip(scratch, files, strict=True):
            final = os.path.join(out_dir, name)
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise CredentialRefused(
                    "OUT_DIR",
                    f"{final} appeared while writing; nothing was written",
                    "Move it aside and run again",
                ) from None
            placed.append(final)
    except BaseException as e:
        for path in placed:
            os.unlink(path)
        if isinstance(e, OSError):
            raise CredentialRefused(
                "OUT_DIR",
                f"cannot write to {out_dir}: {e.strerror}; nothing was written",
                "Choose a directory this account can create and write",
            ) from None
        raise
    finally:
        for tmp in scratch:
            if os.path.exists(tmp):
                os.unlink(tmp)
