"""check-host on the node tools: a tool taken off PATH, too old, silent or hanging fails with
its line and fix; optional tools may be missing; the real tools of this host pass."""

from __future__ import annotations

import os
import shutil

import pytest

from socialweb_computer.hostcheck import checks, context, tools

QEMU_FIX = "install QEMU 4.0 or later with TCG (Debian: apt-get install qemu-system-x86)"
RUNC_FIX = "install runc 1.1 or later (Debian: apt-get install runc)"


def test_a_tool_missing_from_path_fails_with_the_path_searched(host) -> None:
    (host.bin / "qemu-system-x86_64").unlink()
    run = host.run("node")
    assert run.code == 1
    assert run.failed == {"qemu"}
    run.line("qemu", "FAIL", f"qemu-system-x86_64 is not on PATH ({host.bin})", QEMU_FIX)


def test_mkfs_missing_names_the_sbin_directory_in_the_fix(host) -> None:
    (host.bin / "mkfs.ext4").unlink()
    run = host.run("gateway")
    assert run.code == 1
    assert run.failed == {"mkfs-ext4"}
    run.line("mkfs-ext4", "FAIL", "mkfs.ext4 is not on PATH",
             f"install e2fsprogs 1.43 or later (Debian: apt-get install e2fsprogs) and put /usr/sbin on "
             f"{host.user}'s PATH")


def test_runc_is_required_for_role_node_and_optional_for_role_gateway(host) -> None:
    (host.bin / "runc").unlink()
    node = host.run("node")
    assert node.code == 1
    node.line("runc", "FAIL", "runc is not on PATH", RUNC_FIX)
    gateway = host.run("gateway")
    assert gateway.code == 0, gateway.out
    gateway.line("runc", "ok", "runc is not on PATH: no sandbox nodes on this host; microVM nodes are "
                 "unaffected (optional for role gateway)")


def test_a_tool_too_old_fails(host) -> None:
    host.tool("mkfs.ext4", 'echo "mke2fs 1.42.9 (28-Dec-2013)" >&2\n')
    run = host.run("node")
    assert run.code == 1
    run.line("mkfs-ext4", "FAIL", f"{host.bin / 'mkfs.ext4'} is version 1.42.9, older than the 1.43 needed")


def test_a_tool_that_prints_no_version_fails(host) -> None:
    host.tool("runc", 'echo "runc: cannot load libseccomp.so.2" >&2; exit 127\n')
    run = host.run("node")
    assert run.code == 1
    run.line("runc", "FAIL", f"{host.bin / 'runc'} --version printed no version (exit status 127): "
             "runc: cannot load libseccomp.so.2", RUNC_FIX)


def test_an_old_optional_tool_on_path_fails_because_it_would_be_used(host) -> None:
    host.tool("containerd", 'echo "containerd github.com/containerd/containerd 1.4.13~ds1 1.4.13~ds1-1"\n')
    run = host.run("gateway")
    assert run.code == 1
    assert run.failed == {"containerd"}
    run.line("containerd", "FAIL", "version 1.4.13, older than the 1.6 needed",
             "install containerd 1.6 or later (Debian: apt-get install containerd), or remove the old one "
             "from PATH")
    host.tool("containerd", 'echo "containerd containerd.io 1.6.20 2806fc1"\n')
    host.run("gateway").line("containerd", "ok", "version 1.6.20")


def test_a_hanging_tool_fails_after_the_timeout(host, real_path: str) -> None:
    host.tool("runc", f"exec {shutil.which('sleep', path=real_path)} 5\n")
    ctx = context.Context(role="node", state_dir=str(host.state), tool_timeout=0.3)
    result = checks.evaluate(next(c for c in checks.CHECKS if c.name == "runc"), ctx)
    assert (result.ok, result.found) == (False, f"{host.bin / 'runc'} --version did not answer within 0.3 s")
    assert result.fix == RUNC_FIX


def test_qemu_without_tcg_fails_when_kvm_is_unusable(host, monkeypatch) -> None:
    monkeypatch.setattr(context, "KVM_DEVICE", str(host.root / "no-kvm"))
    host.tool("qemu-system-x86_64", 'case "$1" in --version) echo "QEMU emulator version 6.2.0";;\n'
              '-accel) printf "Accelerators supported in QEMU binary:\\nkvm\\n";; esac\n')
    run = host.run("node")
    assert run.code == 1
    assert run.failed == {"qemu"}
    run.line("qemu", "FAIL", f"version 6.2.0, {host.bin / 'qemu-system-x86_64'} offers the accelerators "
             "kvm but not tcg, and KVM is not usable here: nodes cannot boot", QEMU_FIX)


def test_the_real_tools_of_this_host_pass(real_path: str) -> None:
    """Whatever node tools this machine really has must be judged usable; the rest is not installed here."""
    present = [tool for tool in tools.TOOLS if shutil.which(tool.binary, path=real_path)]
    if not present:
        pytest.skip("none of the node tools is installed on this machine")
    ctx = context.Context(role="node", state_dir=os.getcwd(), env={"PATH": real_path})
    for tool in present:
        finding = tools.run(tool, ctx)
        assert finding.ok, finding.found
        assert "version" in finding.found
