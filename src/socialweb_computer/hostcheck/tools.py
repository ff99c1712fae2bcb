"""The programs a node boot runs on the host, found on the account's PATH at a usable version.

One row per tool: how to ask its version, the oldest version that works, and for which
roles it is required. A tool that is optional for the role may be missing (the line says
what is lost), but an optional tool that is present and unusable fails: it would be used.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import os
import re
import shutil
import subprocess

from socialweb_computer.hostcheck import context, kvm

BOTH = frozenset({"gateway", "node"})


@dataclasses.dataclass(frozen=True)
class Tool:
    check: str
    binary: str
    version_args: tuple[str, ...]
    pattern: str
    minimum: tuple[int, ...]
    required_for: frozenset[str]
    without: str  # what is lost when an optional tool is missing
    why: str
    fix: str
    extra: collections.abc.Callable[[str, context.Context], context.Finding] | None = None


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def _qemu_accelerators(path: str, ctx: context.Context) -> context.Finding:
    """QEMU must offer TCG when KVM is not usable: some builds (qemu-kvm) have KVM only."""
    try:
        out = subprocess.run([path, "-accel", "help"], capture_output=True, text=True, env=dict(ctx.env),
                             timeout=ctx.tool_timeout, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return context.fail(f"{path} -accel help failed: {e}")
    accels = [line.strip() for line in out.splitlines()[1:] if line.strip()]
    kind, _ = kvm.acceleration(ctx)
    if kind == "tcg" and "tcg" not in accels:
        return context.fail(f"{path} offers the accelerators {', '.join(accels) or 'none'} but not tcg, "
                            "and KVM is not usable here: nodes cannot boot")
    return context.ok(f"accelerators: {', '.join(accels) or 'none listed'}")


TOOLS = (
    Tool("mkfs-ext4", "mkfs.ext4", ("-V",), r"mke2fs (\d+)\.(\d+)(?:\.(\d+))?", (1, 43), BOTH,
         without="",
         why="Node root filesystems are ext4 images filled with mkfs.ext4 -d, which e2fsprogs has had "
             "since 1.43.",
         fix="install e2fsprogs 1.43 or later (Debian: apt-get install e2fsprogs) and put /usr/sbin on "
             "{user}'s PATH"),
    Tool("qemu", "qemu-system-x86_64", ("--version",), r"QEMU emulator version (\d+)\.(\d+)(?:\.(\d+))?",
         (4, 0), BOTH,
         without="",
         why="MicroVM nodes are QEMU guests booted straight into an uncompressed kernel (the PVH entry "
             "point), which QEMU supports since 4.0; without KVM, QEMU must offer TCG.",
         fix="install QEMU 4.0 or later with TCG (Debian: apt-get install qemu-system-x86)",
         extra=_qemu_accelerators),
    Tool("qemu-img", "qemu-img", ("--version",), r"qemu-img version (\d+)\.(\d+)(?:\.(\d+))?", (4, 0), BOTH,
         without="",
         why="Each microVM node boots from a copy-on-write disk (qcow2) over its image's shared root "
             "filesystem, made with qemu-img, so a boot copies nothing.",
         fix="install qemu-img 4.0 or later (Debian: apt-get install qemu-utils)"),
    Tool("depmod", "depmod", ("--version",), r"kmod version (\d+)", (25,), BOTH,
         without="",
         why="A guest image build indexes the kernel modules it puts into the image with kmod's depmod "
             "(the guest loads its network and filesystem drivers on demand).",
         fix="install kmod (Debian: apt-get install kmod) and put /usr/sbin on {user}'s PATH"),
    Tool("runc", "runc", ("--version",), r"runc version (\d+)\.(\d+)(?:\.(\d+))?", (1, 1),
         frozenset({"node"}),
         without="no sandbox nodes on this host; microVM nodes are unaffected",
         why="Sandbox nodes run their Pods' containers with runc on the host (crun fails on cgroup v1 "
             "hybrid hosts). Required for role node; for role gateway it is optional.",
         fix="install runc 1.1 or later (Debian: apt-get install runc)"),
    Tool("containerd", "containerd", ("--version",), r"containerd \S+ v?(\d+)\.(\d+)(?:\.(\d+))?", (1, 6),
         frozenset({"node"}),
         without="no sandbox nodes on this host; microVM nodes are unaffected",
         why="Every sandbox node runs a containerd daemon of its own (its own root, state and socket) and "
             "drives its Pods through containerd's CRI plugin; `ctr` from the same package imports the pause "
             "image. Required for role node; for role gateway it is optional.",
         fix="install containerd 1.6 or later (Debian: apt-get install containerd), or remove the old one "
             "from PATH"),
    Tool("slirp4netns", "slirp4netns", ("--version",), r"slirp4netns version (\d+)\.(\d+)(?:\.(\d+))?",
         (1, 0), BOTH,
         without="",
         why="A node's network namespace (a sandbox node's, or the one a microVM node's QEMU runs in) "
             "reaches the outside through slirp4netns' user-mode network (no bridge or route on the host, "
             "and no access to the host's loopback).",
         fix="install slirp4netns 1.0 or later (Debian: apt-get install slirp4netns)"),
    Tool("tini", "tini", ("--version",), r"tini version (\d+)\.(\d+)(?:\.(\d+))?", (0, 18),
         frozenset({"node"}),
         without="no sandbox nodes on this host; microVM nodes are unaffected",
         why="tini is the init of a sandbox node's PID namespace: it reaps the node's orphans and passes "
             "SIGTERM on; when it ends, the kernel ends every process of the node.",
         fix="install tini 0.18 or later (Debian: apt-get install tini)"),
    Tool("unshare", "unshare", ("--version",), r"unshare from util-linux (\d+)\.(\d+)(?:\.(\d+))?",
         (2, 32), frozenset({"node"}),
         without="no sandbox nodes on this host; microVM nodes are unaffected",
         why="Sandbox nodes start in new PID, mount, network, UTS and IPC namespaces made by util-linux's "
             "unshare (--kill-child needs 2.32).",
         fix="install util-linux 2.32 or later (Debian: apt-get install util-linux)"),
    Tool("nft", "nft", ("--version",), r"nftables v(\d+)\.(\d+)(?:\.(\d+))?", (1, 0), frozenset({"node"}),
         without="no sandbox nodes on this host; microVM nodes are unaffected",
         why="A sandbox node programs its Services (ClusterIP, NodePort) as an nftables table inside its "
             "own network namespace, with the host's nft; nothing is added to the host's ruleset. Required "
             "for role node; for role gateway it is optional.",
         fix="install nftables 1.0 or later (Debian: apt-get install nftables)"),
)


def run(tool: Tool, ctx: context.Context) -> context.Finding:
    search_path = ctx.env.get("PATH", os.defpath)
    path = shutil.which(tool.binary, path=search_path)
    if not path:
        if ctx.role in tool.required_for:
            return context.fail(f"{tool.binary} is not on PATH ({search_path})")
        return context.ok(f"{tool.binary} is not on PATH: {tool.without} (optional for role {ctx.role})")
    command = " ".join([path, *tool.version_args])
    try:
        proc = subprocess.run([path, *tool.version_args], capture_output=True, text=True, env=dict(ctx.env),
                              timeout=ctx.tool_timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return context.fail(f"{command} did not answer within {ctx.tool_timeout:g} s")
    except OSError as e:
        return context.fail(f"{path} cannot run: {e.strerror or e}")
    match = re.search(tool.pattern, proc.stdout + proc.stderr)
    if not match:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        return context.fail(f"{command} printed no version (exit status {proc.returncode})"
                            + (f": {said[0][:120]}" if said else ""))
    version = tuple(int(part or 0) for part in match.groups())
    if version < tool.minimum:
        return context.fail(f"{path} is version {_version_text(version)}, older than the "
                            f"{_version_text(tool.minimum)} needed")
    found = f"{path} version {_version_text(version)}"
    if tool.extra:
        extra = tool.extra(path, ctx)
        return context.Finding(extra.ok, f"{found}, {extra.found}")
    return context.ok(found)
