"""Container images for tests, built here and served from a registry on loopback.

No test pulls from the internet: images are made from Debian's `busybox-static` (one
static binary and a symlink per applet, `/etc/passwd`, `/etc/group`) with the project's
OCI writer, and pushed with skopeo to a Debian `docker-registry` that the tests start on
a free 127.0.0.1 port, optionally behind htpasswd basic auth (for imagePullSecrets).

    with Registry.start(tmp) as registry:
        ref = registry.push(busybox_image(), "test/busybox:1")   # "127.0.0.1:PORT/test/busybox:1"
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from socialweb_computer.node import oci

BUSYBOX = Path("/bin/busybox")
PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    "app:x:1000:1000:app:/home/app:/bin/sh\n"
)
GROUP = "root:x:0:\nnobody:x:65534:\napp:x:1000:\n"


def busybox_image(
    *,
    extra_files: dict[str, bytes] | None = None,
    entrypoint: list[str] | None = None,
    cmd: list[str] | None = None,
    user: str = "",
) -> oci.Image:
    """busybox-static as an image: `sh`, `httpd`, `wget`, `nc`, ... on PATH=/bin."""
    image = oci.Image(entrypoint=entrypoint, cmd=cmd or ["sh"], env=["PATH=/bin:/usr/bin"], user=user)
    image.add_file("bin/busybox", BUSYBOX.read_bytes(), mode=0o755)
    applets = subprocess.run(
        [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for applet in applets:
        if applet != "busybox":
            image.add_symlink(f"bin/{applet}", "busybox")
    image.add_file("etc/passwd", PASSWD.encode())
    image.add_file("etc/group", GROUP.encode())
    image.add_dir("tmp", mode=0o1777)
    image.add_dir("home/app", mode=0o755, uid=1000, gid=1000)
    for path, data in (extra_files or {}).items():
        image.add_file(path, data, mode=0o755)
    return image


def python_image(*distributions: str, without: tuple[str, ...] = ()) -> oci.Image:
    """busybox plus this interpreter, its standard library and `distributions` (with what they
    require, as installed here) on PYTHONPATH: a pod that runs Python, e.g. the official client.
    `without`: parts of them to leave out, as paths in site-packages (`kubernetes/aio`).

    Files keep their paths (the interpreter finds its library where it was built to), shared
    libraries come from `ldd`, and the distributions' files from their installed RECORD."""
    image = busybox_image()
    executable = Path(sys.executable).resolve()
    stdlib = Path(
        sysconfig.get_paths(vars={"installed_base": sys.base_prefix, "base": sys.base_prefix})["stdlib"]
    )
    binaries = [executable]
    image.add_file(str(executable), executable.read_bytes(), mode=0o755)
    image.add_symlink("bin/python3", str(executable))
    for path in sorted(stdlib.rglob("*")):
        relative = path.relative_to(stdlib)
        if (relative.parts and relative.parts[0] in _STDLIB_LEFT_OUT) or _left_out(path):
            continue
        image.add_file(str(path), path.read_bytes(), mode=0o755 if path.suffix == ".so" else 0o644)
        if path.suffix == ".so":
            binaries.append(path)
    for dist in _closure(distributions):
        for entry in dist.files or []:
            if (entry.parts and entry.parts[0] == "..") or str(entry).startswith(without or ("\0",)):
                continue  # scripts outside site-packages, or what the caller leaves out
            source = Path(str(dist.locate_file(entry)))
            if not _left_out(source):
                image.add_file(
                    f"opt/site/{entry}", source.read_bytes(), mode=0o755 if source.suffix == ".so" else 0o644
                )
                if source.suffix == ".so":
                    binaries.append(source)
    for library in _shared_libraries(binaries):
        image.add_file(str(library), library.resolve().read_bytes(), mode=0o755)
    image.config["Env"] = ["PATH=/bin:/usr/bin", "PYTHONPATH=/opt/site", "PYTHONDONTWRITEBYTECODE=1"]
    image.compresslevel = 1
    return image


# Parts of the standard library no test pod imports (tests, GUIs, the build's static library).
_STDLIB_LEFT_OUT = frozenset(
    {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "unittest"}
    | {f"config-{sys.version_info.major}.{sys.version_info.minor}-x86_64-linux-gnu"}
)


def _left_out(path: Path) -> bool:
    """Optimised bytecode (never used without -O), tests and Tk: a fifth of the image's size."""
    return (
        not path.is_file()
        or ".opt-" in path.name
        or path.name.startswith("_tkinter")
        or bool({"test", "tests", "e2e_test"} & set(path.parts))
    )


def _closure(names: tuple[str, ...]) -> list[metadata.Distribution]:
    """The installed distributions `names` require, without extras, each once."""
    found: dict[str, metadata.Distribution] = {}
    pending = list(names)
    while pending:
        name = re.split(r"[ ;<>=!~\[(]", pending.pop().strip(), maxsplit=1)[0].lower().replace("_", "-")
        if not name or name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python
        found[name] = dist
        pending += [r for r in dist.requires or [] if "extra ==" not in r]
    return list(found.values())


def _shared_libraries(binaries: list[Path]) -> set[Path]:
    """What the dynamic loader maps for `binaries` (ldd's paths, the loader itself included)."""
    out: set[Path] = set()
    for binary in binaries:
        result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
        for line in result.stdout.splitlines():
            fields = line.split()
            if "=>" in fields and len(fields) > fields.index("=>") + 1:
                candidate = fields[fields.index("=>") + 1]
            elif fields and fields[0].startswith("/"):
                candidate = fields[0]
            else:
                continue
            if candidate.startswith("/") and Path(candidate).exists():
                out.add(Path(candidate))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class Registry:
    """A docker-registry process on 127.0.0.1 (plain HTTP), optionally with basic auth."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    username: str = ""
    password: str = ""

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @classmethod
    @contextlib.contextmanager
    def start(cls, directory: Path, *, username: str = "", password: str = "") -> Iterator[Registry]:
        registry = cls.launch(directory, username=username, password=password)
        try:
            yield registry
        finally:
            registry.stop()

    @classmethod
    def launch(cls, directory: Path, *, username: str = "", password: str = "") -> Registry:
        directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        auth = ""
        if username:
            htpasswd = directory / "htpasswd"
            htpasswd.write_text(f"{username}:{_bcrypt(password)}\n")
            auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n"
        config = directory / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {directory / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{port}\n{auth}"
        )
        log = open(directory / "registry.log", "ab")  # noqa: SIM115 - the process keeps it
        process = subprocess.Popen(
            ["docker-registry", "serve", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
        )
        registry = cls(port, directory, process, username, password)
        registry._wait()
        return registry

    def _wait(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {(self.directory / 'registry.log').read_text()}")
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1)
                return
            except urllib.error.HTTPError:
                return  # 401 from an auth registry: it is up
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("docker-registry did not answer")

    def push(self, image: oci.Image, name: str) -> str:
        """Pushes `image` as `name` (`repo:tag`); returns the full reference."""
        with tempfile.TemporaryDirectory(prefix="oci-") as tmp:
            layout = Path(tmp) / "layout"
            repo, _, tag = name.rpartition(":")
            image.write_layout(layout, tag)
            command = [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                f"oci:{layout}:{tag}",
                f"docker://{self.host}/{name}",
            ]
            if self.username:
                command[3:3] = ["--dest-creds", f"{self.username}:{self.password}"]
            env = {**os.environ, "TMPDIR": tmp, "XDG_RUNTIME_DIR": tmp, "HOME": tmp}
            result = subprocess.run(command, capture_output=True, text=True, env=env)
            if result.returncode != 0:
                raise RuntimeError(f"skopeo copy failed: {result.stderr.strip()}")
        return f"{self.host}/{repo}:{tag}"

    def dockerconfigjson(self) -> str:
        """The `.dockerconfigjson` of a pull secret for this registry (base64 for a Secret's data)."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        document = (
            f'{{"auths":{{"{self.host}":{{"username":"{self.username}","password":"{self.password}",'
            f'"auth":"{token}"}}}}}}'
        )
        return base64.b64encode(document.encode()).decode()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory / "data", ignore_errors=True)


def _bcrypt(password: str) -> str:
    """A bcrypt htpasswd hash (the only kind docker-registry accepts), from apache2-utils' htpasswd."""
    result = subprocess.run(["htpasswd", "-nbB", "x", password], capture_output=True, text=True, check=True)
    return result.stdout.strip().split(":", 1)[1]
