"""The cluster DNS, served by every node itself at the kube-dns ClusterIP (10.96.0.10).

A kubelet writes `nameserver <clusterDNS>` and the search path
`<ns>.svc.<domain> svc.<domain> <domain>` (ndots:5) into a ClusterFirst pod's resolv.conf;
this module answers that address from inside the node's network (the address is put on the
node's `lo`, so pods reach it through their default route, with no DNAT), UDP and TCP. It
answers from the `ServiceTable` (node/services.py), as CoreDNS's `kubernetes` plugin does
with `pods insecure`:

    <svc>.<ns>.svc.<domain>                 A: the ClusterIP; a headless Service's ready
                                            endpoints (all with publishNotReadyAddresses);
                                            ExternalName: a CNAME to its target
    <host>.<svc>.<ns>.svc.<domain>          A: the endpoint with that hostname (StatefulSet
                                            pods: `pod-0.<serviceName>`), or a-b-c-d
    _<port>._<proto>.<svc>.<ns>.svc.<domain> SRV per named port (headless: per endpoint),
                                            with the targets' A records as additional data
    <a-b-c-d>.<ns>.pod.<domain>             A: a.b.c.d
    in-addr.arpa of a ClusterIP or endpoint PTR: its name above

AAAA (an IPv4 cluster) and other types of a name that exists are NOERROR without answers;
a name under the domain that does not exist is NXDOMAIN with the zone's SOA; TTLs are 5 s
(CoreDNS's). Everything else is forwarded to the node's own resolvers (its resolv.conf:
the user-mode network's 10.0.2.3). Messages are parsed and written by dnspython; nothing of
the wire format is written here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import struct
import subprocess
from typing import Any

import dns.asyncquery
import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.reversename
import dns.rrset

from socialweb_computer import binary
from socialweb_computer.node import services as services_mod

log = logging.getLogger(__name__)

Object = dict[str, Any]
TTL = 5
FORWARD_TIMEOUT = 2.0
MAX_FORWARDS = 256
TCP_IDLE_SECONDS = 10.0
A, AAAA, SRV, PTR, CNAME, SOA, NS, ANY = (
    dns.rdatatype.A,
    dns.rdatatype.AAAA,
    dns.rdatatype.SRV,
    dns.rdatatype.PTR,
    dns.rdatatype.CNAME,
    dns.rdatatype.SOA,
    dns.rdatatype.NS,
    dns.rdatatype.ANY,
)
REVERSE = dns.name.from_text("in-addr.arpa.")


@dataclasses.dataclass
class Answer:
    """What the zone says of one question; `forward` when the zone has nothing to say."""

    rcode: int = dns.rcode.NOERROR
    answer: list[dns.rrset.RRset] = dataclasses.field(default_factory=list)
    authority: list[dns.rrset.RRset] = dataclasses.field(default_factory=list)
    additional: list[dns.rrset.RRset] = dataclasses.field(default_factory=list)
    forward: bool = False


def dashed(ip: str) -> str:
    return ip.replace(".", "-")


def undashed(label: str) -> str | None:
    try:
        address = ipaddress.ip_address(label.replace("-", "."))
    except ValueError:
        return None
    return str(address) if address.version == 4 else None


class Zone:
    """The cluster's names, read from the ServiceTable at each question (it is small and current)."""

    def __init__(self, table: services_mod.ServiceTable, domain: str, server_ip: str) -> None:
        self.table = table
        self.origin = dns.name.from_text(domain.rstrip(".") + ".")
        self.server_ip = server_ip

    # ---------------------------------------------------------------- records

    def _name(self, *labels: str) -> dns.name.Name:
        return dns.name.Name([label.encode() for label in labels]).concatenate(self.origin)

    def _rrset(self, name: dns.name.Name, rdtype: int, *texts: str) -> dns.rrset.RRset:
        return dns.rrset.from_text_list(name, TTL, dns.rdataclass.IN, rdtype, list(texts))

    def soa(self) -> dns.rrset.RRset:
        text = f"ns.dns.{self.origin} hostmaster.{self.origin} 1 7200 1800 86400 {TTL}"
        return self._rrset(self.origin, SOA, text)

    def _service_ips(self, svc: Object) -> list[str]:
        spec = svc.get("spec") or {}
        return [
            ip
            for ip in dict.fromkeys([spec.get("clusterIP"), *(spec.get("clusterIPs") or [])])
            if isinstance(ip, str) and ip not in ("", "None") and ipaddress.ip_address(ip).version == 4
        ]

    def _endpoints(self, svc: Object) -> list[services_mod.Endpoint]:
        meta = svc.get("metadata") or {}
        endpoints = self.table.endpoints_of(meta.get("namespace", ""), meta.get("name", ""))
        if (svc.get("spec") or {}).get("publishNotReadyAddresses"):
            return endpoints
        return [e for e in endpoints if e.ready]

    # ---------------------------------------------------------------- questions

    def lookup(self, qname: dns.name.Name, qtype: int) -> Answer:
        if qname.is_subdomain(REVERSE):
            return self._reverse(qname, qtype)
        if not qname.is_subdomain(self.origin):
            return Answer(forward=True)
        labels = [label.decode(errors="replace").lower() for label in qname.relativize(self.origin).labels]
        if labels == ["@"] or not labels:
            return self._apex(qtype)
        found = self._find(labels, qname, qtype)
        if found is None:
            return Answer(rcode=dns.rcode.NXDOMAIN, authority=[self.soa()])
        if not found.answer and found.rcode == dns.rcode.NOERROR:
            found.authority.append(self.soa())
        return found

    def _apex(self, qtype: int) -> Answer:
        if qtype == SOA:
            return Answer(answer=[self.soa()])
        if qtype == NS:
            ns = self._name("ns", "dns")
            return Answer(
                answer=[self._rrset(self.origin, NS, str(ns))],
                additional=[self._rrset(ns, A, self.server_ip)],
            )
        return Answer(authority=[self.soa()])

    def _find(self, labels: list[str], qname: dns.name.Name, qtype: int) -> Answer | None:
        """None: no such name (NXDOMAIN)."""
        if labels == ["ns", "dns"]:
            return Answer(answer=[self._rrset(qname, A, self.server_ip)] if qtype in (A, ANY) else [])
        if labels in (["svc"], ["pod"], ["dns"]):
            return Answer()
        kind = labels[-1]
        if kind == "pod" and len(labels) == 3:
            ip = undashed(labels[0])
            if ip is None:
                return None
            return Answer(answer=[self._rrset(qname, A, ip)] if qtype in (A, ANY) else [])
        if kind == "pod" and len(labels) == 2:
            return Answer() if self._namespace_known(labels[0]) else None
        if kind != "svc":
            return None
        if len(labels) == 2:  # <ns>.svc
            return Answer() if self._namespace_known(labels[0]) else None
        namespace, service_name = labels[-2], labels[-3]
        svc = self.table.service(namespace, service_name)
        if svc is None:
            return None
        rest = labels[:-3]
        if not rest:
            return self._service(svc, qname, qtype)
        if len(rest) == 2 and rest[0].startswith("_") and rest[1].startswith("_"):
            return self._srv(svc, qname, qtype, rest[0][1:], rest[1][1:])
        if len(rest) == 1 and rest[0].startswith("_"):
            return Answer()  # `_<port>` alone: an empty non-terminal of the SRV names
        if len(rest) == 1:
            return self._endpoint(svc, qname, qtype, rest[0])
        return None

    def _namespace_known(self, namespace: str) -> bool:
        return any((s.get("metadata") or {}).get("namespace") == namespace for s in self.table.all_services())

    def _service(self, svc: Object, qname: dns.name.Name, qtype: int) -> Answer:
        spec = svc.get("spec") or {}
        if spec.get("type") == "ExternalName":
            target = dns.name.from_text(str(spec.get("externalName") or "").rstrip(".") + ".")
            out = Answer(answer=[self._rrset(qname, CNAME, str(target))])
            if qtype not in (CNAME, ANY) and target.is_subdomain(self.origin):
                chased = self.lookup(target, qtype)
                out.answer += chased.answer
            elif qtype not in (CNAME, ANY):
                out.forward = True  # the target's records come from upstream (resolve_cname)
            return out
        ips = self._service_ips(svc)
        headless = not ips
        if qtype == SRV:
            return self._srv(svc, qname, qtype, None, None)
        if qtype not in (A, ANY):
            return Answer()
        if headless:
            endpoints = self._endpoints(svc)
            ips = sorted({e.ip for e in endpoints}, key=ipaddress.ip_address)
        return Answer(answer=[self._rrset(qname, A, *ips)] if ips else [])

    def _endpoint(self, svc: Object, qname: dns.name.Name, qtype: int, label: str) -> Answer | None:
        if self._service_ips(svc):
            return None  # only headless Services have per-endpoint names
        for endpoint in self._endpoints(svc):
            if label in (endpoint.hostname, dashed(endpoint.ip)):
                return Answer(answer=[self._rrset(qname, A, endpoint.ip)] if qtype in (A, ANY) else [])
        return None

    def _srv(
        self, svc: Object, qname: dns.name.Name, qtype: int, port_name: str | None, protocol: str | None
    ) -> Answer | None:
        spec = svc.get("spec") or {}
        meta = svc["metadata"]
        ports = [
            p
            for p in spec.get("ports") or []
            if isinstance(p, dict)
            and (port_name is None or (p.get("name") or "") == port_name)
            and (protocol is None or str(p.get("protocol") or "TCP").lower() == protocol)
        ]
        if port_name is not None and not ports:
            return None
        if qtype not in (SRV, ANY):
            return Answer()
        service_name = self._name(meta["name"], meta["namespace"], "svc")
        records: list[str] = []
        additional: list[dns.rrset.RRset] = []
        ips = self._service_ips(svc)
        if ips:
            records = [f"0 100 {p['port']} {service_name}" for p in ports]
            additional = [self._rrset(service_name, A, *ips)]
        else:
            endpoints = self._endpoints(svc)
            weight = 100 // max(1, len(endpoints))
            for endpoint in endpoints:
                target = self._name(
                    endpoint.hostname or dashed(endpoint.ip), meta["name"], meta["namespace"], "svc"
                )
                for port in ports:
                    found = endpoint.ports.get(port.get("name") or "")
                    if found is not None:
                        records.append(f"0 {weight} {found[0]} {target}")
                additional.append(self._rrset(target, A, endpoint.ip))
        return Answer(
            answer=[self._rrset(qname, SRV, *sorted(set(records)))] if records else [], additional=additional
        )

    def _reverse(self, qname: dns.name.Name, qtype: int) -> Answer:
        try:
            ip = dns.reversename.to_address(qname)
        except (dns.exception.SyntaxError, ValueError):
            return Answer(forward=True)
        names = self._names_of(ip)
        if not names:
            return Answer(forward=True)
        return Answer(answer=[self._rrset(qname, PTR, *names)] if qtype in (PTR, ANY) else [])

    def _names_of(self, ip: str) -> list[str]:
        out = []
        for svc in self.table.all_services():
            meta = svc.get("metadata") or {}
            service_name = self._name(meta.get("name", ""), meta.get("namespace", ""), "svc")
            if ip in self._service_ips(svc):
                out.append(str(service_name))
            elif not self._service_ips(svc):
                for endpoint in self._endpoints(svc):
                    if endpoint.ip == ip:
                        label = endpoint.hostname or dashed(ip)
                        out.append(f"{label}.{service_name}")
        return sorted(set(out))


# ---------------------------------------------------------------- the server


class Server:
    """UDP and TCP on `address:port`, answering from the Zone and forwarding the rest."""

    def __init__(
        self, zone: Zone, address: str, upstreams: list[str], *, port: int = 53, upstream_port: int = 53
    ) -> None:
        self.zone = zone
        self.address = address
        self.port = port
        self.upstream_port = upstream_port
        self.upstreams = [u for u in upstreams if (u, upstream_port) != (address, port)]
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._forwards = asyncio.Semaphore(MAX_FORWARDS)
        self._tasks: set[asyncio.Task[None]] = set()
        self.added_address = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Udp(self), local_addr=(self.address, self.port), reuse_port=False
        )
        self._udp = transport  # type: ignore[assignment]
        self._tcp = await asyncio.start_server(self._tcp_client, self.address, self.port)

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def respond(self, wire: bytes, *, udp: bool) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
        except dns.exception.DNSException:
            return _format_error(wire)
        if query.flags & dns.flags.QR or len(query.question) != 1:
            return _format_error(wire) if not query.flags & dns.flags.QR else None
        question = query.question[0]
        found = self.zone.lookup(question.name, question.rdtype)
        if found.forward:
            return await self._forward(query, found, udp=udp)
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        response.set_rcode(found.rcode)
        response.answer += found.answer
        response.authority += found.authority
        response.additional += found.additional
        return _to_wire(response, query, udp=udp)

    async def _forward(self, query: dns.message.Message, partial: Answer, *, udp: bool) -> bytes | None:
        asked = query
        if partial.answer:  # an ExternalName's CNAME: ask upstream for its target
            target = partial.answer[0][0].target
            asked = dns.message.make_query(target, query.question[0].rdtype)
        reply = None
        async with self._forwards:
            for upstream in self.upstreams:
                try:
                    reply = await dns.asyncquery.udp(
                        asked, upstream, port=self.upstream_port, timeout=FORWARD_TIMEOUT
                    )
                    if reply.flags & dns.flags.TC:
                        reply = await dns.asyncquery.tcp(
                            asked, upstream, port=self.upstream_port, timeout=FORWARD_TIMEOUT
                        )
                    break
                except (dns.exception.DNSException, OSError) as exc:
                    log.info("forwarding %s to %s failed: %s", query.question[0].name, upstream, exc)
        response = dns.message.make_response(query)
        if reply is None:
            response.set_rcode(dns.rcode.SERVFAIL)
        elif partial.answer:
            response.answer += partial.answer + reply.answer
            response.set_rcode(reply.rcode())
        else:
            response.set_rcode(reply.rcode())
            response.flags |= reply.flags & (dns.flags.AA | dns.flags.AD)
            response.answer += reply.answer
            response.authority += reply.authority
            response.additional += [r for r in reply.additional if r.rdtype != dns.rdatatype.OPT]
        return _to_wire(response, query, udp=udp)

    async def _tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await asyncio.wait_for(reader.readexactly(2), TCP_IDLE_SECONDS)
                (length,) = struct.unpack("!H", header)
                wire = await asyncio.wait_for(reader.readexactly(length), TCP_IDLE_SECONDS)
                reply = await self.respond(wire, udp=False)
                if reply is None:
                    break
                writer.write(struct.pack("!H", len(reply)) + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.server.spawn(self._answer(data, addr))

    async def _answer(self, data: bytes, addr: tuple[str, int]) -> None:
        reply = await self.server.respond(data, udp=True)
        if reply is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(reply, addr)


def _to_wire(response: dns.message.Message, query: dns.message.Message, *, udp: bool) -> bytes:
    limit = max(512, query.payload) if udp and query.edns >= 0 else (512 if udp else 65535)
    try:
        return response.to_wire(max_size=limit)
    except dns.exception.TooBig:
        response.answer.clear()
        response.authority.clear()
        response.additional.clear()
        response.flags |= dns.flags.TC
        return response.to_wire(max_size=limit)


def _format_error(wire: bytes) -> bytes | None:
    """FORMERR for a message whose header can be read; nothing for anything shorter."""
    if len(wire) < 12:
        return None
    response = dns.message.Message(id=struct.unpack("!H", wire[:2])[0])
    response.flags = dns.flags.QR
    response.set_rcode(dns.rcode.FORMERR)
    return response.to_wire()


# ---------------------------------------------------------------- on the node


def add_address(address: str) -> bool:
    """Puts `address`/32 on the node's `lo`; False if it was there already."""
    result = subprocess.run(
        ["ip", "addr", "add", f"{address}/32", "dev", "lo"],
        capture_output=True,
        text=True,
        env=binary.child_env(),
    )
    if result.returncode == 0:
        return True
    if "exists" in result.stderr.lower():
        return False
    raise RuntimeError(f"cannot put {address} on lo: {result.stderr.strip()}")


def remove_address(address: str) -> None:
    subprocess.run(
        ["ip", "addr", "del", f"{address}/32", "dev", "lo"], capture_output=True, env=binary.child_env()
    )
