"""The gateway spec: the YAML file an operator passes with `--spec` (or $SOCIALWEB_GATEWAY_SPEC).

It says which clusters must exist at start, where the gateway listens, and the defaults
for nodes. Everything is optional; an empty file (or none) means the defaults below.
Unknown keys are refused rather than ignored, so a typo never silently changes nothing.
`docs/gateway.md` documents every field; `check-host` reads the same spec for its ports.

Secrets never live here: they come from the environment (the systemd unit's
EnvironmentFile), so the spec can be shown and versioned freely.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import yaml

from socialweb_computer import logs, loopback
from socialweb_computer.apiserver import fairness, listener
from socialweb_computer.guest import config as guest_config
from socialweb_computer.storage import sqlite

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_API_PORT = 8788
DEFAULT_ADMIN_PORT = 6443
DEFAULT_CLUSTER_PORTS = (6444, 7443)
DEFAULT_HISTORY_LIMIT = sqlite.DEFAULT_HISTORY_LIMIT
DEFAULT_COMPACT_INTERVAL = sqlite.DEFAULT_COMPACT_INTERVAL
STORAGE_BACKENDS = ("sqlite", "etcd")
# The same defaults as storage/etcd.py, which is imported only when a spec selects etcd
# (it brings gRPC with it).
DEFAULT_ETCD_PREFIX = "/socialweb-computer"
DEFAULT_ETCD_REQUEST_TIMEOUT = 5.0
DEFAULT_OWNER_LEASE_SECONDS = 15
DEFAULT_MAX_NODES = 10
BIDDERS = ("sandbox", "qemu", "none")

# Processes serving tenants: `auto` (0) is one per core; 1 keeps them in the gateway's process.
DEFAULT_WORKERS = 1
MAX_WORKERS = 64

# A Cluster's name becomes a directory name, a key prefix and a kubeconfig context: a DNS label.
CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
CLUSTER_NAME_RULE = ("use lowercase letters, digits and '-', starting and ending with a letter or digit, "
                     "at most 63 characters")

# What each tenant cluster may take of the gateway unless its Cluster says otherwise
# (apiserver/fairness.py explains each; docs/gateway.md gives the reasons for the numbers).
DEFAULT_LIMITS = fairness.Limits(objects=20_000, pods=1_000, watches=500, requests_in_flight=100,
                                 controller_writes_per_second=20.0)
LIMIT_FIELDS = {
    "objects": "objects",
    "pods": "pods",
    "watches": "watches",
    "requestsInFlight": "requests_in_flight",
    "controllerWritesPerSecond": "controller_writes_per_second",
}


class SpecError(ValueError):
    """The spec cannot be used; the message names the field and how to fix it."""


@dataclasses.dataclass(frozen=True)
class NodeDefaults:
    """What a node gets unless its Cluster says otherwise (the guest image's manifest values)."""

    vcpu: int = 2
    mem_mib: int = 2048
    rootfs_mib: int = 8192
    release_after_seconds: int = 120
    max: int = DEFAULT_MAX_NODES  # nodes capacity may rent for one cluster

    def as_json(self) -> dict[str, int]:
        return {
            "vcpu": self.vcpu,
            "memMiB": self.mem_mib,
            "rootfsMiB": self.rootfs_mib,
            "releaseAfterSeconds": self.release_after_seconds,
            "max": self.max,
        }

    def merged(self, overrides: dict[str, int]) -> NodeDefaults:
        """These defaults with a Cluster's `spec.nodes` (its keys, as the CRD spells them) on top."""
        known = {_NODE_FIELDS[k]: v for k, v in overrides.items()
                 if k in _NODE_FIELDS and isinstance(v, int) and not isinstance(v, bool)}
        return dataclasses.replace(self, **known)


@dataclasses.dataclass(frozen=True)
class HostBudget:
    """What capacity may hand out across all tenants and the warm pool; None = from the host."""

    vcpu: int | None = None
    mem_mib: int | None = None
    disk_mib: int | None = None


@dataclasses.dataclass(frozen=True)
class WarmPool:
    """Pre-booted nodes of `nodeDefaults`' size: `nodes` always, up to `max` as pause pods ask."""

    nodes: int = 0
    max: int = 0


@dataclasses.dataclass(frozen=True)
class CapacitySpec:
    """`capacity`: who starts nodes (the bidder) and within what limits."""

    bidder: str = "none"  # "sandbox", "qemu", or "none": no node is ever rented
    priority_cutoff: int = 0  # pods below this priority are placeholders (pause pods), never work
    host_budget: HostBudget = HostBudget()
    warm_pool: WarmPool = WarmPool()

    def as_json(self) -> dict[str, Any]:
        budget = self.host_budget
        return {
            "bidder": self.bidder,
            "priorityCutoff": self.priority_cutoff,
            "hostBudget": {"vcpu": budget.vcpu, "memMiB": budget.mem_mib, "diskMiB": budget.disk_mib},
            "warmPool": {"nodes": self.warm_pool.nodes, "max": self.warm_pool.max},
        }


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    name: str
    running: bool = True
    nodes: dict[str, int] = dataclasses.field(default_factory=dict)
    bidder: str = ""  # "" = the gateway's capacity.bidder


@dataclasses.dataclass(frozen=True)
class EtcdSpec:
    """`storage.etcd`: how to reach the etcd cluster (file paths are absolute once parsed)."""

    endpoints: tuple[str, ...]
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_prefix: str = DEFAULT_ETCD_PREFIX
    request_timeout: float = DEFAULT_ETCD_REQUEST_TIMEOUT
    owner_lease_seconds: int = DEFAULT_OWNER_LEASE_SECONDS

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"endpoints": list(self.endpoints), "keyPrefix": self.key_prefix}
        files = (("caFile", self.ca_file), ("certFile", self.cert_file), ("keyFile", self.key_file))
        for key, value in files:
            if value:
                out[key] = value
        return out


@dataclasses.dataclass(frozen=True)
class RegistrySpec:
    """How nodes pull from one registry (`registries[]`); credentials by reference only."""

    host: str  # as image references name it: registry.example.com, 127.0.0.1:5000
    plain_http: bool
    skip_verify: bool = False
    mirrors: tuple[str, ...] = ()
    credentials_env: str = ""  # an environment variable holding "username:password"

    @property
    def endpoint(self) -> str:
        return f"{'http' if self.plain_http else 'https'}://{self.host}"


@dataclasses.dataclass(frozen=True)
class GatewaySpec:
    address: str = DEFAULT_ADDRESS
    api_port: int = DEFAULT_API_PORT
    admin_port: int = DEFAULT_ADMIN_PORT
    cluster_ports: tuple[int, int] = DEFAULT_CLUSTER_PORTS
    history_limit: int = DEFAULT_HISTORY_LIMIT
    compact_interval: float = DEFAULT_COMPACT_INTERVAL
    storage_backend: str = "sqlite"
    etcd: EtcdSpec | None = None
    node_defaults: NodeDefaults = NodeDefaults()
    capacity: CapacitySpec = CapacitySpec()
    clusters: tuple[ClusterSpec, ...] = ()
    log_level: str = ""  # "" = not set here (flag, environment or INFO decide)
    log_format: str = ""  # "" = not set here (flag, environment or text decide)
    registries: tuple[RegistrySpec, ...] = ()
    # What microVM nodes boot (`guestImage`); its sizes come from nodeDefaults / a Cluster's spec.nodes.
    guest_image: guest_config.ImageConfig = dataclasses.field(default_factory=guest_config.ImageConfig)
    connections: listener.ConnectionLimits = dataclasses.field(default_factory=listener.ConnectionLimits)
    limits: fairness.Limits = DEFAULT_LIMITS
    # Processes serving tenants (gateway/workers.py): 1 serves them in the gateway's own process,
    # 0 is `auto`.
    workers: int = DEFAULT_WORKERS


_NODE_FIELDS = {
    "vcpu": "vcpu",
    "memMiB": "mem_mib",
    "rootfsMiB": "rootfs_mib",
    "releaseAfterSeconds": "release_after_seconds",
    "max": "max",
}
_NODE_MINIMUMS = {"releaseAfterSeconds": 0, "max": 0}
_TOP_FIELDS = (
    "listen", "storage", "nodeDefaults", "capacity", "clusters", "logging", "registries", "guestImage",
    "limits", "workers",
)
_GUEST_IMAGE_FIELDS = ("suite", "kernel", "packages", "agent", "files")
_CAPACITY_FIELDS = ("bidder", "priorityCutoff", "hostBudget", "warmPool")
_BUDGET_FIELDS = {"vcpu": "vcpu", "memMiB": "mem_mib", "diskMiB": "disk_mib"}
_POOL_FIELDS = ("nodes", "max")
_LOGGING_FIELDS = ("level", "format")
_REGISTRY_FIELDS = ("host", "plainHTTP", "skipVerify", "mirrors", "credentialsEnv")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONNECTION_FIELDS = {
    "handshakeTimeoutSeconds": "handshake_timeout",
    "headerTimeoutSeconds": "header_timeout",
    "bodyTimeoutSeconds": "body_timeout",
    "idleTimeoutSeconds": "idle_timeout",
}
_LISTEN_FIELDS = ("address", "apiPort", "adminPort", "clusterPorts", "maxConnections", *_CONNECTION_FIELDS)
_STORAGE_FIELDS = ("backend", "historyLimit", "compactInterval", "etcd")
_ETCD_FIELDS = (
    "endpoints", "caFile", "certFile", "keyFile", "keyPrefix", "requestTimeout", "ownerLeaseSeconds",
)
_CLUSTER_FIELDS = ("name", "running", "nodes", "bidder")


def load(path: str | None) -> GatewaySpec:
    """Read and check a spec file; no path means all defaults."""
    if not path:
        return GatewaySpec()
    try:
        with open(path, encoding="utf-8") as f:
            document = yaml.safe_load(f)
    except OSError as e:
        raise SpecError(
            f"cannot read the gateway spec {path}: {e.strerror}. Pass an existing file with "
            "--spec (or $SOCIALWEB_GATEWAY_SPEC), or leave it out for the defaults."
        ) from None
    except yaml.YAMLError as e:
        raise SpecError(f"the gateway spec {path} is not valid YAML: {e}") from None
    return parse(document, source=path, base_dir=os.path.dirname(os.path.abspath(path)))


def parse(document: Any, *, source: str = "spec", base_dir: str = ".") -> GatewaySpec:
    """Check a spec document; relative file paths in it are taken from `base_dir`."""
    if document is None:
        document = {}
    root = _mapping(document, source, _TOP_FIELDS)
    listen = _mapping(root.get("listen", {}), f"{source}: listen", _LISTEN_FIELDS)
    storage = _mapping(root.get("storage", {}), f"{source}: storage", _STORAGE_FIELDS)
    logging = _mapping(root.get("logging", {}), f"{source}: logging", _LOGGING_FIELDS)
    address = str(listen.get("address", DEFAULT_ADDRESS))
    try:
        loopback.require_loopback(address)
    except loopback.LoopbackOnlyError as e:
        raise SpecError(f"{source}: listen.address: {e}") from None
    spec = GatewaySpec(
        address=address,
        api_port=_port(listen.get("apiPort", DEFAULT_API_PORT), f"{source}: listen.apiPort"),
        admin_port=_port(listen.get("adminPort", DEFAULT_ADMIN_PORT), f"{source}: listen.adminPort"),
        cluster_ports=_port_range(listen.get("clusterPorts"), f"{source}: listen.clusterPorts"),
        history_limit=_int(
            storage.get("historyLimit", DEFAULT_HISTORY_LIMIT), f"{source}: storage.historyLimit", minimum=100
        ),
        compact_interval=_number(
            storage.get("compactInterval", DEFAULT_COMPACT_INTERVAL), f"{source}: storage.compactInterval"
        ),
        storage_backend=_backend(storage, f"{source}: storage"),
        etcd=_etcd(storage, f"{source}: storage", base_dir),
        node_defaults=_node_defaults(root.get("nodeDefaults", {}), f"{source}: nodeDefaults"),
        capacity=_capacity(root.get("capacity", {}), f"{source}: capacity"),
        clusters=_clusters(root.get("clusters", []), f"{source}: clusters"),
        log_level=_choice(logging.get("level", ""), f"{source}: logging.level", logs.LEVELS),
        log_format=_choice(logging.get("format", ""), f"{source}: logging.format", logs.FORMATS),
        registries=_registries(root.get("registries", []), f"{source}: registries"),
        guest_image=_guest_image(root.get("guestImage", {}), f"{source}: guestImage", base_dir),
        connections=_connections(listen, f"{source}: listen"),
        limits=limits(root.get("limits", {}), f"{source}: limits", DEFAULT_LIMITS),
        workers=parse_workers(root.get("workers", DEFAULT_WORKERS), f"{source}: workers"),
    )
    return spec


def parse_workers(value: Any, where: str) -> int:
    if value == "auto" or value == 0:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise SpecError(f"{where}: expected auto (one per core) or a number of processes from 1 to "
                        f"{MAX_WORKERS}, got {value!r}")
    return value


def _choice(value: Any, where: str, allowed: tuple[str, ...]) -> str:
    if value == "":
        return ""
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(f"{where}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _connections(listen: dict[str, Any], where: str) -> listener.ConnectionLimits:
    defaults = listener.ConnectionLimits()
    values: dict[str, Any] = {}
    for key, attr in _CONNECTION_FIELDS.items():
        if key in listen:
            values[attr] = _positive_number(listen[key], f"{where}.{key}")
    if "maxConnections" in listen:
        values["max_connections"] = _int(listen["maxConnections"], f"{where}.maxConnections", minimum=1)
    return dataclasses.replace(defaults, **values)


def limits(value: Any, where: str, base: fairness.Limits) -> fairness.Limits:
    """`limits` of the spec (over the defaults) or of a Cluster's spec (over the gateway's)."""
    mapping = _mapping(value if value is not None else {}, where, tuple(LIMIT_FIELDS))
    values: dict[str, Any] = {}
    for key, attr in LIMIT_FIELDS.items():
        if key not in mapping:
            continue
        if key == "controllerWritesPerSecond":
            values[attr] = _positive_number(mapping[key], f"{where}.{key}")
        else:
            values[attr] = _int(mapping[key], f"{where}.{key}", minimum=1)
    return dataclasses.replace(base, **values)


def _positive_number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise SpecError(f"{where}: expected a number greater than 0, got {value!r}")
    return float(value)


def _mapping(value: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping with the keys {', '.join(allowed)}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r}; the known fields are {', '.join(allowed)}")
    return value


def _int(value: Any, where: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{where}: expected an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise SpecError(f"{where}: {value} is out of range; it must be {bound}")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise SpecError(f"{where}: expected a number of seconds (0 or more), got {value!r}")
    return float(value)


def _backend(storage: dict[str, Any], where: str) -> str:
    backend = storage.get("backend", "sqlite")
    if backend not in STORAGE_BACKENDS:
        raise SpecError(f"{where}.backend: {backend!r} is not a storage backend; use sqlite or etcd")
    if backend == "etcd" and "etcd" not in storage:
        raise SpecError(f"{where}.backend is etcd, but {where}.etcd is missing: give at least "
                        "etcd.endpoints, such as [https://10.0.0.1:2379]")
    if backend != "etcd" and "etcd" in storage:
        raise SpecError(f"{where}.etcd is set, but {where}.backend is {backend}: set backend: etcd to use it")
    return str(backend)


def _etcd(storage: dict[str, Any], where: str, base_dir: str) -> EtcdSpec | None:
    if "etcd" not in storage:
        return None
    from socialweb_computer.storage import etcd

    where = f"{where}.etcd"
    fields = _mapping(storage["etcd"], where, _ETCD_FIELDS)
    endpoints = fields.get("endpoints")
    try:
        etcd.parse_endpoints(endpoints)  # type: ignore[arg-type]
        prefix = etcd.check_prefix(str(fields.get("keyPrefix", DEFAULT_ETCD_PREFIX)))
    except etcd.ConfigError as e:
        raise SpecError(f"{where}: {e}") from None
    files: dict[str, str | None] = {}
    for field in ("caFile", "certFile", "keyFile"):
        value = fields.get(field)
        if value is not None and (not isinstance(value, str) or not value):
            raise SpecError(f"{where}.{field}: expected a file path, got {value!r}")
        files[field] = os.path.join(base_dir, value) if value else None
    if bool(files["certFile"]) != bool(files["keyFile"]):
        raise SpecError(f"{where}: give both certFile and keyFile (the client certificate and its key), "
                        "or neither")
    if files["caFile"] and not str(endpoints[0]).startswith("https://"):  # type: ignore[index]
        raise SpecError(f"{where}: caFile, certFile and keyFile need https:// endpoints")
    return EtcdSpec(
        endpoints=tuple(str(e) for e in endpoints),  # type: ignore[union-attr]
        ca_file=files["caFile"],
        cert_file=files["certFile"],
        key_file=files["keyFile"],
        key_prefix=prefix,
        request_timeout=_number(fields.get("requestTimeout", DEFAULT_ETCD_REQUEST_TIMEOUT),
                                f"{where}.requestTimeout") or DEFAULT_ETCD_REQUEST_TIMEOUT,
        owner_lease_seconds=_int(fields.get("ownerLeaseSeconds", DEFAULT_OWNER_LEASE_SECONDS),
                                 f"{where}.ownerLeaseSeconds", minimum=2, maximum=3600),
    )


def _port(value: Any, where: str) -> int:
    return _int(value, where, minimum=0, maximum=65535)


def _port_range(value: Any, where: str) -> tuple[int, int]:
    if value is None:
        return DEFAULT_CLUSTER_PORTS
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", str(value))
    if not match:
        raise SpecError(f'{where}: expected a range such as "6444-7443", got {value!r}')
    low, high = int(match[1]), int(match[2])
    if not 1 <= low <= high <= 65535:
        raise SpecError(f"{where}: {value!r} is not a range of ports (1-65535, low to high)")
    return low, high


def _node_defaults(value: Any, where: str) -> NodeDefaults:
    fields = _node_fields(value, where)
    return NodeDefaults(**{_NODE_FIELDS[k]: v for k, v in fields.items()})


def _node_fields(value: Any, where: str) -> dict[str, int]:
    mapping = _mapping(value, where, tuple(_NODE_FIELDS))
    return {key: _int(mapping[key], f"{where}.{key}", minimum=_NODE_MINIMUMS.get(key, 1)) for key in mapping}


def _bidder(value: Any, where: str, *, allow_default: bool = False) -> str:
    allowed = BIDDERS + (("",) if allow_default else ())
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(f"{where}: {value!r} is not a bidder; use {', '.join(BIDDERS)}")
    return value


def _capacity(value: Any, where: str) -> CapacitySpec:
    fields = _mapping(value, where, _CAPACITY_FIELDS)
    budget = _mapping(fields.get("hostBudget", {}), f"{where}.hostBudget", tuple(_BUDGET_FIELDS))
    pool = _mapping(fields.get("warmPool", {}), f"{where}.warmPool", _POOL_FIELDS)
    cutoff = fields.get("priorityCutoff", 0)
    if isinstance(cutoff, bool) or not isinstance(cutoff, int):
        raise SpecError(f"{where}.priorityCutoff: expected an integer priority, got {cutoff!r}")
    nodes = _int(pool.get("nodes", 0), f"{where}.warmPool.nodes")
    ceiling = _int(pool.get("max", nodes), f"{where}.warmPool.max")
    if ceiling < nodes:
        raise SpecError(f"{where}.warmPool: max ({ceiling}) is below nodes ({nodes}); "
                        "max is the ceiling pause-pod demand may grow the pool to")
    warm = WarmPool(nodes, ceiling)
    return CapacitySpec(
        bidder=_bidder(fields.get("bidder", "none"), f"{where}.bidder"),
        priority_cutoff=cutoff,
        host_budget=HostBudget(**{_BUDGET_FIELDS[k]: _int(budget[k], f"{where}.hostBudget.{k}")
                                  for k in budget}),
        warm_pool=warm,
    )


def _clusters(value: Any, where: str) -> tuple[ClusterSpec, ...]:
    if not isinstance(value, list):
        raise SpecError(f"{where}: expected a list such as [{{name: ci}}]")
    seen: set[str] = set()
    clusters = []
    for index, item in enumerate(value):
        here = f"{where}[{index}]"
        entry = _mapping(item, here, _CLUSTER_FIELDS)
        name = entry.get("name")
        if not isinstance(name, str) or not CLUSTER_NAME.match(name):
            raise SpecError(f"{here}.name: {name!r} is not a cluster name: {CLUSTER_NAME_RULE}")
        if name in seen:
            raise SpecError(f"{here}.name: cluster {name!r} is listed twice")
        seen.add(name)
        running = entry.get("running", True)
        if not isinstance(running, bool):
            raise SpecError(f"{here}.running: expected true or false, got {running!r}")
        clusters.append(ClusterSpec(name, running, _node_fields(entry.get("nodes", {}), f"{here}.nodes"),
                                    _bidder(entry.get("bidder", ""), f"{here}.bidder", allow_default=True)))
    return tuple(clusters)


def _loopback_host(host: str) -> bool:
    name = host.rsplit(":", 1)[0].strip("[]") if host.count(":") <= 1 or host.startswith("[") else host
    return name in ("localhost", "::1") or name.startswith("127.")


def _registries(value: Any, where: str) -> tuple[RegistrySpec, ...]:
    if not isinstance(value, list):
        raise SpecError(f"{where}: expected a list such as [{{host: registry.example.com}}]")
    out = []
    for index, item in enumerate(value):
        here = f"{where}[{index}]"
        entry = _mapping(item, here, _REGISTRY_FIELDS)
        host = entry.get("host")
        if not isinstance(host, str) or not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+", host):
            raise SpecError(f"{here}.host: expected a registry host as image references name it "
                            f"(registry.example.com, 127.0.0.1:5000), got {host!r}")
        flags = {}
        for key, default in (("plainHTTP", _loopback_host(host)), ("skipVerify", False)):
            flag = entry.get(key, default)
            if not isinstance(flag, bool):
                raise SpecError(f"{here}.{key}: expected true or false, got {flag!r}")
            flags[key] = flag
        mirrors = entry.get("mirrors", [])
        if not isinstance(mirrors, list) or not all(
            isinstance(m, str) and re.match(r"^https?://[^/\s]+", m) for m in mirrors
        ):
            raise SpecError(f"{here}.mirrors: expected a list of URLs such as https://mirror.example.com")
        env = entry.get("credentialsEnv", "")
        if env and (not isinstance(env, str) or not _ENV_NAME.match(env)):
            raise SpecError(
                f"{here}.credentialsEnv: expected the name of an environment variable, got {env!r}"
            )
        out.append(RegistrySpec(host, flags["plainHTTP"], flags["skipVerify"], tuple(mirrors), env or ""))
    return tuple(out)


def _guest_image(value: Any, where: str, base_dir: str) -> guest_config.ImageConfig:
    if isinstance(value, dict):
        for size in ("vcpu", "memMiB", "rootfsMiB"):
            if size in value:
                raise SpecError(f"{where}.{size}: a node's size is not part of guestImage; set "
                                f"nodeDefaults.{size} (or a Cluster's spec.nodes.{size}) instead")
    entry = _mapping(value, where, _GUEST_IMAGE_FIELDS)
    try:
        return guest_config.parse(entry, base=Path(base_dir).resolve(), source=where)
    except guest_config.ImageConfigError as e:
        raise SpecError(str(e)) from None


def node_registries(
    spec: GatewaySpec, env: dict[str, str] | None = None
) -> tuple[list[Any], dict[str, tuple[str, str]], list[int]]:
    """What a bidder gives its nodes from `registries`: the registry configs, the credentials
    (read now from the environment they reference) and the host loopback ports they need."""
    import os

    from socialweb_computer.node import config as node_config

    env = dict(os.environ) if env is None else env
    configs, credentials, ports = [], {}, []
    for registry in spec.registries:
        configs.append(node_config.RegistryConfig(
            host=registry.host, endpoint=registry.endpoint, skip_verify=registry.skip_verify,
            mirrors=registry.mirrors,
        ))
        if registry.credentials_env:
            value = env.get(registry.credentials_env, "")
            user, sep, password = value.partition(":")
            if not sep or not user:
                raise SpecError(
                    f"registries: {registry.host}: credentialsEnv names ${registry.credentials_env}, which "
                    "is unset or not \"username:password\"; set it in the gateway's environment file"
                )
            credentials[registry.host] = (user, password)
        for address in (registry.host, *(m.split("://", 1)[1].split("/", 1)[0] for m in registry.mirrors)):
            if _loopback_host(address) and ":" in address:
                ports.append(int(address.rsplit(":", 1)[1]))
    return configs, credentials, sorted(set(ports))
