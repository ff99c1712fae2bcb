"""The on-disk side of tenant clusters: the state directory's layout, each cluster's PKI,
and minting scoped client certificates with a cluster's ClientCA.

The gateway writes this layout; `internal tenantcredential` and `credential mint` read it
without talking to a running gateway. It depends on `auth` (and the `api` leaf) only.
"""

from socialweb_computer.clusterprovider.credential import (
    CredentialRefused,
    TenantCredential,
    mint_node_credential_for_cluster,
    mint_tenant_credential_for_cluster_as,
    parse_go_duration,
)

__all__ = [
    "CredentialRefused",
    "TenantCredential",
    "mint_node_credential_for_cluster",
    "mint_tenant_credential_for_cluster_as",
    "parse_go_duration",
]
