"""In-cluster networking's parts on their own: Service variables, the nftables ruleset, the cluster
DNS zone and server (real UDP and TCP on loopback, real dnspython clients), serving certificates.

The ruleset is checked by the real `nft` (`-c`: parsed and validated by the kernel, committed
nowhere) inside a network namespace of the test's own; everything with real nodes and pods is
in test_networking.py.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import dns.asyncquery
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import pytest
from cryptography import x509

from socialweb_computer.auth import pki
from socialweb_computer.clusterprovider import layout
from socialweb_computer.node import clusterdns, envvars, proxy, services
from socialweb_computer.testing import images

Object = dict[str, Any]
NODE = "n1"


class Table(services.ServiceTable):
    """A ServiceTable filled by the test instead of informers."""

    def __init__(self) -> None:
        super().__init__(client=None)  # type: ignore[arg-type]
        self.services.synced.set()
        self.slices.synced.set()

    def service(self, namespace: str, name: str, **spec: Any) -> Object:  # type: ignore[override]
        if not spec:
            return super().service(namespace, name)  # type: ignore[return-value]
        obj = {"metadata": {"namespace": namespace, "name": name}, "spec": spec}
        self.services.cache[(namespace, name)] = obj
        self._changed()
        return obj

    def slice(
        self, namespace: str, service: str, endpoints: list[Object], ports: list[Object], name: str = ""
    ) -> None:
        self._slice_event(
            "ADDED",
            {
                "metadata": {
                    "namespace": namespace,
                    "name": name or f"{service}-abcde",
                    "labels": {services.SERVICE_NAME_LABEL: service},
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": ports,
            },
        )


def endpoint(
    ip: str, *, ready: bool = True, node: str = NODE, hostname: str = "", **conditions: bool
) -> Object:
    out: Object = {"addresses": [ip], "conditions": {"ready": ready, **conditions}, "nodeName": node}
    if hostname:
        out["hostname"] = hostname
    return out


@pytest.fixture
def table() -> Table:
    t = Table()
    t.service(
        "default",
        "kubernetes",
        clusterIP="10.96.0.1",
        ports=[{"name": "https", "port": 443, "protocol": "TCP"}],
    )
    t.slice(
        "default",
        "kubernetes",
        [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        [{"name": "https", "port": 6443, "protocol": "TCP"}],
        name="kubernetes",
    )
    t.service(
        "kube-system",
        "kube-dns",
        clusterIP="10.96.0.10",
        ports=[
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ],
    )
    return t


# ---------------------------------------------------------------- a kubelet's variables


def test_service_variables_are_a_kubelets() -> None:
    svc = {
        "metadata": {"name": "web-api", "namespace": "shop"},
        "spec": {
            "clusterIP": "10.96.7.7",
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP"},
                {"name": "dns-udp", "port": 53, "protocol": "UDP"},
            ],
        },
    }
    assert services.service_variables(svc) == {
        "WEB_API_SERVICE_HOST": "10.96.7.7",
        "WEB_API_SERVICE_PORT": "80",
        "WEB_API_SERVICE_PORT_HTTP": "80",
        "WEB_API_SERVICE_PORT_DNS_UDP": "53",
        "WEB_API_PORT": "tcp://10.96.7.7:80",
        "WEB_API_PORT_80_TCP": "tcp://10.96.7.7:80",
        "WEB_API_PORT_80_TCP_PROTO": "tcp",
        "WEB_API_PORT_80_TCP_PORT": "80",
        "WEB_API_PORT_80_TCP_ADDR": "10.96.7.7",
        "WEB_API_PORT_53_UDP": "udp://10.96.7.7:53",
        "WEB_API_PORT_53_UDP_PROTO": "udp",
        "WEB_API_PORT_53_UDP_PORT": "53",
        "WEB_API_PORT_53_UDP_ADDR": "10.96.7.7",
    }


def test_which_services_a_pod_sees(table: Table) -> None:
    table.service("shop", "web", clusterIP="10.96.7.7", ports=[{"port": 80}])
    table.service("shop", "headless", clusterIP="None", ports=[{"port": 80}])
    table.service("shop", "outside", type="ExternalName", externalName="example.com")
    table.service("other", "db", clusterIP="10.96.8.8", ports=[{"port": 5432}])
    env = table.service_environment("shop", enable_service_links=True)
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1" and env["KUBERNETES_SERVICE_PORT"] == "443"
    assert env["WEB_SERVICE_HOST"] == "10.96.7.7"
    assert not [k for k in env if k.startswith(("HEADLESS_", "OUTSIDE_", "DB_", "KUBE_DNS_"))]
    # enableServiceLinks: false keeps the apiserver's, as a kubelet does.
    assert set(table.service_environment("shop", enable_service_links=False)) == {
        k for k in env if k.startswith("KUBERNETES_")
    }
    assert "KUBE_DNS_SERVICE_HOST" in table.service_environment("kube-system", enable_service_links=True)
    table.services.synced.clear()
    with pytest.raises(services.NotSynced, match="services have not yet been read at least once"):
        table.service_environment("shop", enable_service_links=True)


async def test_container_variables_win_and_may_reference_service_ones() -> None:
    container = {
        "env": [
            {"name": "WEB_SERVICE_PORT", "value": "8080"},
            {"name": "URL", "value": "http://$(WEB_SERVICE_HOST):$(WEB_SERVICE_PORT)"},
        ]
    }
    pod = {"metadata": {"namespace": "shop", "name": "p"}}

    async def lookup(kind: str, namespace: str, name: str) -> None:
        return None

    env, _ = await envvars.environment(
        pod,
        container,
        lookup=lookup,
        allocatable={},
        service_env={"WEB_SERVICE_HOST": "10.96.7.7", "WEB_SERVICE_PORT": "80"},
    )
    assert env == [
        ("WEB_SERVICE_PORT", "8080"),
        ("URL", "http://10.96.7.7:8080"),
        ("WEB_SERVICE_HOST", "10.96.7.7"),
    ]


# ---------------------------------------------------------------- the ruleset

NETWORK = proxy.Network(NODE, "10.244.3.0/24", "10.244.0.0/16", "10.96.0.0/12", "10.96.0.10")


def _web(table: Table, **spec: Any) -> None:
    table.service(
        "shop",
        "web",
        clusterIP="10.96.7.7",
        ports=[{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}],
        **spec,
    )
    table.slice(
        "shop",
        "web",
        [
            endpoint("10.244.3.5"),
            endpoint("10.244.3.6"),
            endpoint("10.244.3.7", ready=False),  # unready: left out
            endpoint("10.244.9.5", node="n2"),  # another node's: not routed from here
        ],
        [{"name": "http", "port": 8080, "protocol": "TCP"}],
    )


def test_cluster_ips_pick_among_ready_local_endpoints(table: Table) -> None:
    _web(table, type="NodePort")
    ports = {p.id: p for p in proxy.service_ports(table, NETWORK)}
    assert set(ports) == {
        "default/kubernetes/tcp/https",
        "shop/web/tcp/http",
    }  # kube-dns is served by the node
    web = ports["shop/web/tcp/http"]
    assert [t.ip for t in web.targets] == ["10.244.3.5", "10.244.3.6"] and web.node_port == 30080
    rules = proxy.build(list(ports.values()), NETWORK)
    assert rules.chains["svc-shop/web/tcp/http"] == [
        "numgen random mod 2 vmap { 0 : goto ep-shop/web/tcp/http/10.244.3.5/8080, "
        "1 : goto ep-shop/web/tcp/http/10.244.3.6/8080 }"
    ]
    assert rules.chains["ep-shop/web/tcp/http/10.244.3.5/8080"] == [
        "ip saddr 10.244.3.5 jump mark-for-masquerade",  # hairpin
        "meta l4proto tcp dnat to 10.244.3.5:8080",
    ]
    assert rules.chains["ep-default/kubernetes/tcp/https/127.0.0.1/6443"][-1] == (
        "meta l4proto tcp dnat to 127.0.0.1:6443"
    )
    assert rules.chains["nodeport-shop/web/tcp/http"] == [
        "jump mark-for-masquerade",
        "goto svc-shop/web/tcp/http",
    ]
    assert "10.96.0.10" not in "".join(rules.chains["services"])
    _nft_check(rules.render(previous=None))


def test_affinity_policies_and_terminating_endpoints(table: Table) -> None:
    _web(table, sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 60}})
    table.service("shop", "local", clusterIP="10.96.7.8", internalTrafficPolicy="Local", ports=[{"port": 81}])
    table.slice("shop", "local", [endpoint("10.244.9.8", node="n2")], [{"port": 8081}])
    table.service("shop", "draining", clusterIP="10.96.7.9", ports=[{"port": 82}])
    table.slice(
        "shop",
        "draining",
        [endpoint("10.244.3.9", ready=False, serving=True, terminating=True)],
        [{"port": 8082}],
    )
    ports = {p.id: p for p in proxy.service_ports(table, NETWORK)}
    assert ports["shop/local/tcp/81"].targets == ()  # no endpoint on this node
    assert [t.ip for t in ports["shop/draining/tcp/82"].targets] == ["10.244.3.9"]  # serving terminating
    rules = proxy.build(list(ports.values()), NETWORK)
    assert rules.sets == {
        "aff-shop/web/tcp/http/10.244.3.5/8080": 60,
        "aff-shop/web/tcp/http/10.244.3.6/8080": 60,
    }
    assert rules.chains["svc-shop/web/tcp/http"][0] == (
        "ip saddr @aff-shop/web/tcp/http/10.244.3.5/8080 goto ep-shop/web/tcp/http/10.244.3.5/8080"
    )
    assert "svc-shop/local/tcp/81" not in rules.chains  # refused by filter-forward
    first = rules.render(previous=None)
    _nft_check(first)
    # The next sync keeps the sets (and their members) and drops what is gone.
    table.service("shop", "web", clusterIP="10.96.7.7", ports=[{"name": "http", "port": 80}])
    after = proxy.build(proxy.service_ports(table, NETWORK), NETWORK)
    text = after.render(previous=rules)
    assert "flush table ip socialweb" in text and "delete table" not in text
    assert "delete set ip socialweb aff-shop/web/tcp/http/10.244.3.5/8080" in text
    _nft_check(first + text)


def _nft_check(script: str) -> None:
    if shutil.which("nft") is None or shutil.which("unshare") is None:
        pytest.skip("nft and unshare are needed to check a ruleset")
    result = subprocess.run(
        ["unshare", "--net", "nft", "-c", "-f", "-"], input=script, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------- the cluster DNS zone


def _headless(table: Table) -> None:
    table.service("shop", "db", clusterIP="None", ports=[{"name": "pg", "port": 5432, "protocol": "TCP"}])
    table.slice(
        "shop",
        "db",
        [
            endpoint("10.244.3.20", hostname="db-0"),
            endpoint("10.244.3.21", hostname="db-1"),
            endpoint("10.244.3.22", hostname="db-2", ready=False),
        ],
        [{"name": "pg", "port": 5432, "protocol": "TCP"}],
    )


def _ask(zone: clusterdns.Zone, name: str, rdtype: str) -> clusterdns.Answer:
    return zone.lookup(dns.name.from_text(name), dns.rdatatype.from_text(rdtype))


def _texts(found: clusterdns.Answer) -> list[str]:
    return sorted(r.to_text() for rrset in found.answer for r in rrset)


def test_zone_answers_services_endpoints_and_pods(table: Table) -> None:
    _web(table)
    _headless(table)
    table.service("shop", "outside", type="ExternalName", externalName="web.shop.svc.cluster.local")
    zone = clusterdns.Zone(table, "cluster.local", "10.96.0.10")
    assert _texts(_ask(zone, "web.shop.svc.cluster.local.", "A")) == ["10.96.7.7"]
    assert _texts(_ask(zone, "WEB.Shop.svc.cluster.local.", "A")) == ["10.96.7.7"]  # names are case-blind
    assert _texts(_ask(zone, "kubernetes.default.svc.cluster.local.", "A")) == ["10.96.0.1"]
    nodata = _ask(zone, "web.shop.svc.cluster.local.", "AAAA")
    assert (
        nodata.rcode == dns.rcode.NOERROR
        and not nodata.answer
        and nodata.authority[0].rdtype == dns.rdatatype.SOA
    )
    assert _texts(_ask(zone, "_http._tcp.web.shop.svc.cluster.local.", "SRV")) == [
        "0 100 80 web.shop.svc.cluster.local."
    ]
    assert _texts(_ask(zone, "db.shop.svc.cluster.local.", "A")) == [
        "10.244.3.20",
        "10.244.3.21",
    ]  # ready only
    assert _texts(_ask(zone, "db-1.db.shop.svc.cluster.local.", "A")) == ["10.244.3.21"]
    assert _ask(zone, "db-2.db.shop.svc.cluster.local.", "A").rcode == dns.rcode.NXDOMAIN  # unready
    srv = _ask(zone, "_pg._tcp.db.shop.svc.cluster.local.", "SRV")
    assert _texts(srv) == [
        "0 50 5432 db-0.db.shop.svc.cluster.local.",
        "0 50 5432 db-1.db.shop.svc.cluster.local.",
    ]
    assert {r.name.to_text() for r in srv.additional} == {
        "db-0.db.shop.svc.cluster.local.",
        "db-1.db.shop.svc.cluster.local.",
    }
    assert _texts(_ask(zone, "10-244-3-5.shop.pod.cluster.local.", "A")) == ["10.244.3.5"]
    cname = _ask(zone, "outside.shop.svc.cluster.local.", "A")
    assert _texts(cname) == ["10.96.7.7", "web.shop.svc.cluster.local."]
    assert _texts(_ask(zone, "7.7.96.10.in-addr.arpa.", "PTR")) == ["web.shop.svc.cluster.local."]
    assert _texts(_ask(zone, "21.3.244.10.in-addr.arpa.", "PTR")) == ["db-1.db.shop.svc.cluster.local."]
    for missing in (
        "nope.shop.svc.cluster.local.",
        "web.nope.svc.cluster.local.",
        "x.cluster.local.",
        "web.shop.svc.cluster.local.shop.svc.cluster.local.",
    ):
        found = _ask(zone, missing, "A")
        assert found.rcode == dns.rcode.NXDOMAIN and found.authority[0].rdtype == dns.rdatatype.SOA, missing
    assert _ask(zone, "shop.svc.cluster.local.", "A").rcode == dns.rcode.NOERROR  # an empty non-terminal
    assert _ask(zone, "cluster.local.", "SOA").answer[0].rdtype == dns.rdatatype.SOA
    assert _ask(zone, "example.com.", "A").forward
    assert _ask(zone, "1.1.168.192.in-addr.arpa.", "PTR").forward


# ---------------------------------------------------------------- the server, over the wire


async def test_server_answers_udp_and_tcp_truncates_and_forwards(table: Table) -> None:
    upstream_table = Table()
    upstream_table.service("y", "x", clusterIP="10.96.1.2", ports=[{"port": 80}])
    port, upstream_port = images.free_port(), images.free_port()
    upstream = clusterdns.Server(
        clusterdns.Zone(upstream_table, "upstream.test", "127.0.0.1"), "127.0.0.1", [], port=upstream_port
    )
    server = clusterdns.Server(
        clusterdns.Zone(table, "cluster.local", "127.0.0.1"),
        "127.0.0.1",
        ["127.0.0.1"],
        port=port,
        upstream_port=upstream_port,
    )
    table.service("shop", "many", clusterIP="None", ports=[{"port": 80}])
    table.slice("shop", "many", [endpoint(f"10.244.3.{i}") for i in range(1, 120)], [{"port": 80}])
    await upstream.start()
    await server.start()
    try:
        reply = await dns.asyncquery.udp(
            dns.message.make_query("kubernetes.default.svc.cluster.local.", "A"),
            "127.0.0.1",
            port=port,
            timeout=5,
        )
        assert reply.flags & dns.flags.AA and reply.answer[0][0].to_text() == "10.96.0.1"
        assert reply.answer[0].ttl == clusterdns.TTL
        many = dns.message.make_query("many.shop.svc.cluster.local.", "A")
        truncated = await dns.asyncquery.udp(many, "127.0.0.1", port=port, timeout=5)
        assert truncated.flags & dns.flags.TC and not truncated.answer
        whole = await dns.asyncquery.tcp(many, "127.0.0.1", port=port, timeout=5)
        assert len(whole.answer[0]) == 119
        forwarded = await dns.asyncquery.udp(
            dns.message.make_query("x.y.svc.upstream.test.", "A"), "127.0.0.1", port=port, timeout=5
        )
        assert forwarded.rcode() == dns.rcode.NOERROR and forwarded.answer[0][0].to_text() == "10.96.1.2"
        missing = await dns.asyncquery.udp(
            dns.message.make_query("nope.svc.cluster.local.", "A"), "127.0.0.1", port=port, timeout=5
        )
        assert missing.rcode() == dns.rcode.NXDOMAIN
        garbage = await _raw_udp(port, b"\x12\x34" + b"\x01" * 14)
        assert garbage[:2] == b"\x12\x34" and garbage[3] & 0x0F == dns.rcode.FORMERR
    finally:
        await server.close()
        await upstream.close()
    # Without an upstream that answers, the rest is SERVFAIL.
    port = images.free_port()
    lonely = clusterdns.Server(
        clusterdns.Zone(table, "cluster.local", "127.0.0.1"),
        "127.0.0.1",
        ["127.0.0.1"],
        port=port,
        upstream_port=images.free_port(),
    )
    await lonely.start()
    try:
        failed = await dns.asyncquery.udp(
            dns.message.make_query("example.com.", "A"), "127.0.0.1", port=port, timeout=10
        )
        assert failed.rcode() == dns.rcode.SERVFAIL
    finally:
        await lonely.close()


async def _raw_udp(port: int, data: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    got: asyncio.Future[bytes] = loop.create_future()

    class Client(asyncio.DatagramProtocol):
        def datagram_received(self, reply: bytes, addr: object) -> None:
            if not got.done():
                got.set_result(reply)

    transport, _ = await loop.create_datagram_endpoint(Client, remote_addr=("127.0.0.1", port))
    try:
        transport.sendto(data)
        return await asyncio.wait_for(got, 5)
    finally:
        transport.close()


# ---------------------------------------------------------------- serving certificates


def test_serving_certificate_names_the_in_cluster_addresses(tmp_path) -> None:
    plane = layout.PlanePki(str(tmp_path / "pki"))
    plane.ensure(sync=False)
    assert layout.missing_hosts(plane.serving_cert) == []
    sans = (
        x509.load_pem_x509_certificate(Path(plane.serving_cert).read_bytes())
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert "kubernetes.default.svc.cluster.local" in sans.get_values_for_type(x509.DNSName)
    assert "10.96.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    assert plane.refresh_serving() is False
    # A certificate of an older version names loopback only: the next start mints it again, same CA.
    ca = pki.KeyPair.load(plane.serving_ca, plane.path("serving-ca.key"))
    pki.new_serving_cert(ca).save(plane.serving_cert, plane.serving_key, sync=False)
    assert "kubernetes.default.svc" in layout.missing_hosts(plane.serving_cert)
    assert plane.refresh_serving() is True
    assert layout.missing_hosts(plane.serving_cert) == []
    renewed = x509.load_pem_x509_certificate(Path(plane.serving_cert).read_bytes())
    renewed.verify_directly_issued_by(ca.cert)
