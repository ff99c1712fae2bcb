"""In-cluster networking on a node: the ServiceTable, the Service rules and the cluster DNS.

The agent starts this before its pods (node/agent.py). It reads Services and EndpointSlices
with kube-proxy's credential, which the bidder mints beside the node's own
(`<node dir>/proxy-credential`); a node without one (made by an older bidder) runs its pods
without Services: no Service variables, no rules, and ClusterFirst pods fall back to the
node's resolver with a MissingClusterDNS event, as a kubelet without `--cluster-dns` does.
docs/networking.md says what crosses which boundary.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

from socialweb_computer.client import rest
from socialweb_computer.node import clusterdns, podspec, proxy, services
from socialweb_computer.node import config as config_mod

log = logging.getLogger(__name__)


def user_agent() -> str:
    return f"kube-proxy/{config_mod.KUBELET_VERSION} (linux/amd64) socialweb-computer"


@dataclasses.dataclass
class InCluster:
    table: services.ServiceTable
    proxy: proxy.Proxy | None
    dns: clusterdns.Server | None
    dns_address: str

    @property
    def cluster_dns(self) -> tuple[str, ...]:
        return (self.dns_address,) if self.dns is not None else ()

    @classmethod
    async def start(cls, config: config_mod.NodeConfig, node_dir: config_mod.NodeDir) -> InCluster | None:
        credential = node_dir.proxy_credential
        if not (credential / "tls.crt").exists():
            log.warning("no kube-proxy credential in %s: this node runs pods without Services", credential)
            return None
        client = rest.Client(
            rest.Credentials.from_files(
                config.server, credential / "ca.crt", credential / "tls.crt", credential / "tls.key"
            ),
            user_agent=user_agent(),
        )
        table = services.ServiceTable(client)
        table.start()
        rules = None
        if proxy.nft_available():
            rules = proxy.Proxy(
                table,
                proxy.Network(
                    node=config.name,
                    pod_cidr=config.pod_cidr,
                    cluster_cidr=config.cluster_cidr,
                    service_cidr=config.service_cidr,
                    cluster_dns=config.cluster_dns,
                ),
            )
            rules.start()
        else:
            log.error("nft is not installed: Services are not programmed on this node")
        server = None
        try:
            clusterdns.add_address(config.cluster_dns)
            upstreams, _, _ = podspec.read_resolv_conf(config.resolv_conf)
            zone = clusterdns.Zone(table, config.cluster_domain, config.cluster_dns)
            server = clusterdns.Server(zone, config.cluster_dns, upstreams)
            await server.start()
        except (OSError, RuntimeError) as exc:
            log.error("cannot serve the cluster DNS at %s: %s", config.cluster_dns, exc)
            server = None
        return cls(table, rules, server, config.cluster_dns)

    async def close(self) -> None:
        if self.dns is not None:
            await self.dns.close()
            with contextlib.suppress(OSError):
                clusterdns.remove_address(self.dns_address)
        if self.proxy is not None:
            await self.proxy.close()
        await self.table.close()
