"""Where a gateway keeps things in its state directory, and how a cluster's files appear.

    <state>/gateway.json              what the running gateway is (adminKubeconfig, URLs, pid)
    <state>/state.db                  the one SQLite store every logical cluster shares
    <state>/admin.kubeconfig          system:admin on the admin plane (0600)
    <state>/pki/                      the admin plane's CAs and certificates
    <state>/clusters/<name>/          one tenant cluster:
        cluster.json                  name, uid of its Cluster object, port, url
        pki/                          its serving CA, ClientCA, serving and admin certificates,
          service-account-keys/       the keys that sign its ServiceAccount tokens (0600 each)
        admin.kubeconfig              system:admin in system:masters on the tenant (0600)

A cluster directory is prepared under a temporary name and renamed into place, so it
either exists whole or not at all; leftovers of an interrupted preparation are removed
at the next start. The gateway writes this layout and the credential tools read it, which
is why it lives here rather than in the gateway package.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import ipaddress
import os
import shutil
import tempfile

import orjson
from cryptography import x509

from socialweb_computer.auth import kubeconfig, pki, tokens

GATEWAY_JSON = "gateway.json"
ADMIN_KUBECONFIG = "admin.kubeconfig"
DATABASE = "state.db"
CLUSTERS = "clusters"
CLUSTER_JSON = "cluster.json"
_PREPARING = ".preparing-"
_CA_NAME = "socialweb-computer"
# What a serving certificate names: loopback, where clients outside reach a listener, and what
# a pod reaches its apiserver by (docs/networking.md): the `kubernetes` Service's ClusterIP
# (apiserver.serviceips.KUBERNETES_SERVICE_IP) and its names in the cluster's DNS, as
# kube-apiserver's own certificate has them.
SERVING_HOSTS = (
    "127.0.0.1",
    "localhost",
    "::1",
    "10.96.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclasses.dataclass(frozen=True)
class PlanePki:
    """The certificate files of one logical cluster's listener."""

    directory: str

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def serving_ca(self) -> str:
        return self.path("serving-ca.crt")

    @property
    def client_ca(self) -> str:
        return self.path("client-ca.crt")

    @property
    def client_ca_key(self) -> str:
        return self.path("client-ca.key")

    @property
    def serving_cert(self) -> str:
        return self.path("serving.crt")

    @property
    def serving_key(self) -> str:
        return self.path("serving.key")

    @property
    def kubelet_client_cert(self) -> str:
        """The apiserver's client certificate towards node agents (CN kube-apiserver-kubelet-client)."""
        return self.path("kubelet-client.crt")

    @property
    def kubelet_client_key(self) -> str:
        return self.path("kubelet-client.key")

    def ensure_kubelet_client(self) -> None:
        """Mints (once) the identity the apiserver presents to node agents that serve TLS.

        No groups: it means something to node agents only, never to the apiserver's RBAC. A lock
        keeps two node starts from writing the key of one pair beside the certificate of another.
        """
        if os.path.exists(self.kubelet_client_cert):
            return
        fd = os.open(self.path(".kubelet-client.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            client_ca = pki.KeyPair.load(self.client_ca, self.client_ca_key)
            self._ensure_pair(
                "kubelet-client",
                lambda: pki.new_client_cert(client_ca, "kube-apiserver-kubelet-client"),
                True,
            )
        finally:
            os.close(fd)

    @property
    def service_account_keys(self) -> str:
        """The directory of the keys that sign the cluster's ServiceAccount tokens (auth.tokens)."""
        return self.path(tokens.KEYS_DIRECTORY)

    def token_keys(self) -> tokens.KeySet:
        return tokens.KeySet.ensure(self.service_account_keys)

    def serving_ca_pem(self) -> bytes:
        with open(self.serving_ca, "rb") as f:
            return f.read()

    def ensure(self, *, sync: bool = True) -> None:
        """Mint (once) the serving CA, ClientCA, serving certificate and admin client certificate."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        serving_ca = self._ensure_pair("serving-ca", lambda: pki.new_ca(f"{_CA_NAME} serving CA"), sync)
        client_ca = self._ensure_pair("client-ca", lambda: pki.new_ca(f"{_CA_NAME} client CA"), sync)
        self._ensure_serving(serving_ca, sync)
        self._ensure_pair(
            "admin", lambda: pki.new_client_cert(client_ca, "system:admin", ("system:masters",)), sync
        )
        tokens.KeySet.ensure(self.service_account_keys, sync=sync)

    def refresh_serving(self) -> bool:
        """Mint the serving certificate again if it lacks a name of SERVING_HOSTS (a cluster made
        by an older version); True if it did. Reads one certificate when there is nothing to do."""
        if not missing_hosts(self.serving_cert):
            return False
        self._ensure_serving(pki.KeyPair.load(self.path("serving-ca.crt"), self.path("serving-ca.key")), True)
        return True

    def _ensure_serving(self, serving_ca: pki.KeyPair, sync: bool) -> None:
        """The serving certificate, minted again (same CA) when it lacks a name of SERVING_HOSTS:
        a cluster made by an older version gets the in-cluster names at its next start."""
        if os.path.exists(self.serving_cert) and not missing_hosts(self.serving_cert):
            return
        pair = pki.new_serving_cert(serving_ca, hosts=SERVING_HOSTS)
        pair.save(self.serving_cert, self.serving_key, sync=sync)

    def _ensure_pair(self, stem: str, mint: object, sync: bool) -> pki.KeyPair:
        crt, key = self.path(f"{stem}.crt"), self.path(f"{stem}.key")
        # The key is written first and the certificate last, so a certificate means a whole pair.
        if os.path.exists(crt):
            return pki.KeyPair.load(crt, key)
        pair: pki.KeyPair = mint()  # type: ignore[operator]
        pair.save(crt, key, sync=sync)
        return pair

    def write_admin_kubeconfig(self, path: str, *, context: str, server: str, sync: bool = True) -> None:
        with (
            open(self.serving_ca, "rb") as ca,
            open(self.path("admin.crt"), "rb") as crt,
            open(self.path("admin.key"), "rb") as key,
        ):
            kubeconfig.write(
                path,
                sync=sync,
                cluster=context,
                server=server,
                ca_pem=ca.read(),
                user="system:admin",
                cert_pem=crt.read(),
                key_pem=key.read(),
            )


def missing_hosts(cert_path: str) -> list[str]:
    """The names of SERVING_HOSTS the certificate at `cert_path` does not carry.

    A file that is not a certificate is left alone (the listener says what is wrong with it)."""
    try:
        with open(cert_path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
    except (OSError, ValueError):
        return []
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return list(SERVING_HOSTS)
    names = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    names |= set(sans.get_values_for_type(x509.DNSName))
    return [host for host in SERVING_HOSTS if _canonical(host) not in names]


def _canonical(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


@dataclasses.dataclass(frozen=True)
class ClusterRecord:
    """`cluster.json`: what the credential tools need to know without asking the gateway."""

    name: str
    uid: str
    port: int
    url: str

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


class StateLayout:
    def __init__(self, state_dir: str) -> None:
        self.root = os.path.abspath(state_dir)

    @property
    def gateway_json(self) -> str:
        return os.path.join(self.root, GATEWAY_JSON)

    @property
    def admin_kubeconfig(self) -> str:
        return os.path.join(self.root, ADMIN_KUBECONFIG)

    @property
    def database(self) -> str:
        return os.path.join(self.root, DATABASE)

    @property
    def admin_pki(self) -> PlanePki:
        return PlanePki(os.path.join(self.root, "pki"))

    @property
    def clusters_dir(self) -> str:
        return os.path.join(self.root, CLUSTERS)

    def cluster_dir(self, name: str) -> str:
        return os.path.join(self.clusters_dir, name)

    def cluster_pki(self, name: str) -> PlanePki:
        return PlanePki(os.path.join(self.cluster_dir(name), "pki"))

    def cluster_kubeconfig(self, name: str) -> str:
        return os.path.join(self.cluster_dir(name), ADMIN_KUBECONFIG)

    def read_cluster(self, name: str) -> ClusterRecord | None:
        try:
            with open(os.path.join(self.cluster_dir(name), CLUSTER_JSON), "rb") as f:
                data = orjson.loads(f.read())
        except FileNotFoundError:
            return None
        return ClusterRecord(name=data["name"], uid=data["uid"], port=int(data["port"]), url=data["url"])

    def cluster_names(self) -> list[str]:
        try:
            entries = os.listdir(self.clusters_dir)
        except FileNotFoundError:
            return []
        return sorted(
            e
            for e in entries
            if not e.startswith(".") and os.path.exists(os.path.join(self.clusters_dir, e, CLUSTER_JSON))
        )

    def create_cluster(self, record: ClusterRecord) -> None:
        """Mint the cluster's PKI and kubeconfig in a scratch directory, then rename it into place."""
        os.makedirs(self.clusters_dir, mode=0o700, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=f"{_PREPARING}{record.name}-", dir=self.clusters_dir)
        try:
            plane = PlanePki(os.path.join(scratch, "pki"))
            plane.ensure(sync=False)
            plane.write_admin_kubeconfig(
                os.path.join(scratch, ADMIN_KUBECONFIG), context=record.name, server=record.url, sync=False
            )
            pki.write_public(os.path.join(scratch, CLUSTER_JSON), orjson.dumps(record.as_json()), sync=False)
            _sync_tree(scratch)
            os.rename(scratch, self.cluster_dir(record.name))
            _sync_path(self.clusters_dir)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    def install_cluster(self, name: str, files: dict[str, tuple[int, bytes]]) -> None:
        """Put a cluster directory in place from its files (relative path -> mode, content), as
        the store's copy has them: prepared under a scratch name and renamed over any old one."""
        os.makedirs(self.clusters_dir, mode=0o700, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=f"{_PREPARING}{name}-", dir=self.clusters_dir)
        try:
            write_tree(scratch, files)
            _sync_tree(scratch)
            self.remove_cluster(name)
            os.rename(scratch, self.cluster_dir(name))
            _sync_path(self.clusters_dir)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise

    def remove_cluster(self, name: str) -> None:
        """Rename first, so a half-removed directory never looks like a cluster."""
        target = self.cluster_dir(name)
        if not os.path.exists(target):
            return
        doomed = tempfile.mkdtemp(prefix=f".removing-{name}-", dir=self.clusters_dir)
        os.rename(target, os.path.join(doomed, name))
        shutil.rmtree(doomed, ignore_errors=True)

    def sweep_leftovers(self) -> None:
        """Remove scratch directories an interrupted create or remove left behind."""
        try:
            entries = os.listdir(self.clusters_dir)
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.startswith((_PREPARING, ".removing-")):
                shutil.rmtree(os.path.join(self.clusters_dir, entry), ignore_errors=True)


def replace_tree(root: str, files: dict[str, tuple[int, bytes]]) -> None:
    """Make `root` hold exactly `files`: written beside it, then swapped in by renames."""
    parent = os.path.dirname(root)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f"{_PREPARING}{os.path.basename(root)}-", dir=parent)
    try:
        write_tree(scratch, files)
        _sync_tree(scratch)
        if os.path.exists(root):
            doomed = tempfile.mkdtemp(prefix=f".removing-{os.path.basename(root)}-", dir=parent)
            os.rename(root, os.path.join(doomed, "old"))
            os.rename(scratch, root)
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            os.rename(scratch, root)
        _sync_path(parent)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def read_tree(root: str) -> dict[str, tuple[int, bytes]]:
    """Every regular file under `root`: relative path -> (permission bits, content)."""
    files: dict[str, tuple[int, bytes]] = {}
    for directory, _subdirs, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root)] = (os.stat(path).st_mode & 0o777, f.read())
    return files


def write_tree(root: str, files: dict[str, tuple[int, bytes]]) -> None:
    """Write `read_tree`'s result under `root`: directories 0700, files with their modes (secret
    ones are never readable by others, not even while being written)."""
    for relative, (mode, data) in files.items():
        path = os.path.join(root, relative)
        if os.path.isabs(relative) or os.path.normpath(path) != path or ".." in relative.split(os.sep):
            raise ValueError(f"refusing to write {relative!r} outside {root}")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if mode & 0o077:
            pki.write_public(path, data, sync=False)
            os.chmod(path, mode)
        else:
            pki.write_private(path, data, sync=False)


def _sync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_tree(root: str) -> None:
    """fsync every file and directory under `root` at once, before it is renamed into place.

    Concurrent fsyncs on one filesystem share journal commits, so ten files cost about one
    fsync instead of ten in a row (the bulk of a new cluster's start-up time otherwise).
    """
    paths = [root]
    for directory, subdirs, files in os.walk(root):
        paths.extend(os.path.join(directory, name) for name in (*subdirs, *files))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(paths)) as pool:
        list(pool.map(_sync_path, paths))
