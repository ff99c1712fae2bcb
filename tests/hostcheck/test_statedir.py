"""check-host on the state directory and TMPDIR: a healthy host passes, then each test breaks
one thing for real (tmpfs, read-only bind mount, foreign owner, no space, RAM TMPDIR)."""

from __future__ import annotations

import json
import os

import pytest

from socialweb_computer.hostcheck import context, mounts

DISK_FIX = "put the state directory on real disk, e.g. under TMPDIR=/var/tmp/kcp rather than a tmpfs /tmp"
TMPDIR_FIX = ("set TMPDIR to a directory on real disk in the gateway's environment, "
              "e.g. TMPDIR=/var/tmp/kcp, with the state directory under it")


def test_healthy_node_host_passes_every_check(host) -> None:
    run = host.run("node")
    assert run.code == 0, run.out
    assert list(run.lines) == [
        "state-dir-exists", "state-dir-owner", "state-dir-writable", "state-dir-disk", "state-dir-space",
        "tmpdir-disk", "mkfs-ext4", "qemu", "qemu-img", "depmod", "runc", "containerd", "slirp4netns", "tini",
        "unshare", "nft", "cni-plugins", "cgroups", "oom-score-adj", "node-devices", "kvm", "open-files",
    ]
    run.line("state-dir-exists", "ok", f"{host.state} is a directory")
    run.line("state-dir-writable", "ok", f"{host.user} created and removed a file in {host.state}")
    run.line("state-dir-space", "ok", "needs 1025 MiB: one 1 MiB node root filesystem + 1024 MiB margin")
    assert "check-host (role node): all 22 checks passed" in run.err
    assert not [p for p in os.listdir(host.state) if p.startswith(".check-host-")]


def test_healthy_gateway_host_passes_every_check(host) -> None:
    run = host.run("gateway")
    assert run.code == 0, run.out
    run.line("gateway-ports", "ok", f"api 127.0.0.1:{host.spec['listen']['apiPort']} free")
    run.line("linger", "ok", f"lingering is enabled for {host.user}")


def test_state_dir_on_tmpfs_fails_disk_and_space(host) -> None:
    with host.tmpfs(host.state):
        run = host.run("node")
    assert run.code == 1
    assert run.failed == {"state-dir-disk", "state-dir-space"}
    run.line("state-dir-disk", "FAIL", f"{host.state} is on tmpfs (tmpfs, mounted at {host.state}): tmpfs is "
             "RAM-backed", DISK_FIX)
    run.line("state-dir-space", "FAIL", f"1 MiB free on {host.state} (tmpfs); needs 1025 MiB",
             f"free space on the filesystem holding {host.state}, move the state directory to a larger disk, "
             "or lower rootfsMiB in the gateway spec")


def test_state_dir_read_only_fails_writable(host) -> None:
    with host.mount(host.state, "--bind", str(host.state)):
        host.remount_read_only(host.state)
        run = host.run("node")
    assert run.code == 1
    assert run.failed == {"state-dir-writable"}
    run.line("state-dir-writable", "FAIL",
             f"{host.user} cannot create a file in {host.state}: Read-only file system",
             f"make {host.state} writable for {host.user}: chmod u+rwx {host.state}, or remount its "
             "filesystem read-write")


def test_state_dir_owned_by_another_account_fails_owner(host) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory away to another account needs root")
    os.chown(host.state, 65534, 65534)
    run = host.run("node")
    assert run.code == 1
    assert run.failed == {"state-dir-owner"}
    run.line("state-dir-owner", "FAIL", f"(uid 65534), not by {host.user} (uid 0)",
             f"chown -R {host.user}: {host.state} (as root), or run check-host as the account that runs the "
             "gateway")


def test_missing_state_dir_fails_exists_and_judges_the_parent(host) -> None:
    missing = host.root / "not" / "yet"
    run = host.run("node", state=missing)
    assert run.code == 1
    assert run.failed == {"state-dir-exists"}
    run.line("state-dir-exists", "FAIL", f"{missing} does not exist",
             f"create it as {host.user}, the account that runs the gateway: mkdir -p -m 700 {missing}")
    run.line("state-dir-writable", "ok",
             f"{missing} does not exist yet; {host.user} can create it in {host.root}")
    run.line("state-dir-disk", "ok", f"it does not exist yet, judged by {host.root}")


def test_a_file_in_place_of_the_state_dir_fails_exists(host) -> None:
    in_the_way = host.root / "file"
    in_the_way.write_text("")
    run = host.run("node", state=in_the_way)
    run.line("state-dir-exists", "FAIL", f"{in_the_way} exists but is not a directory",
             f"create it as {host.user}, the account that runs the gateway: mkdir -p -m 700 {in_the_way}")


def test_space_rule_counts_a_root_filesystem_per_running_cluster(host) -> None:
    free_mib = os.statvfs(host.state).f_bavail * os.statvfs(host.state).f_frsize // (1024 * 1024)
    host.write_spec(clusters=[{"name": "ci", "nodes": {"rootfsMiB": free_mib}}, {"name": "docs"},
                              {"name": "off", "running": False, "nodes": {"rootfsMiB": 10**9}}])
    run = host.run("node")
    assert run.code == 1
    assert run.failed == {"state-dir-space"}
    run.line("state-dir-space", "FAIL", f"needs {free_mib + 1 + 1024} MiB: a node root filesystem for each "
             f"of 2 running clusters, {free_mib + 1} MiB, + 1024 MiB margin",
             f"free space on the filesystem holding {host.state}, move the state directory to a larger disk, "
             "or lower rootfsMiB in the gateway spec")


def test_tmpdir_on_tmpfs_with_the_state_under_it_fails(host, monkeypatch) -> None:
    tmp = host.root / "tmp"
    with host.tmpfs(tmp, "64m"):
        monkeypatch.setenv("TMPDIR", str(tmp))
        state = tmp / "kcp"
        state.mkdir()
        run = host.run("node", state=state)
    assert run.code == 1
    assert run.failed == {"state-dir-disk", "state-dir-space", "tmpdir-disk"}
    run.line("tmpdir-disk", "FAIL", f"TMPDIR={tmp} is on tmpfs (tmpfs, mounted at {tmp}): tmpfs is "
             f"RAM-backed, and the state directory {state} is under it", TMPDIR_FIX)


def test_tmpdir_on_tmpfs_with_the_state_elsewhere_passes(host, monkeypatch) -> None:
    tmp = host.root / "tmp"
    with host.tmpfs(tmp):
        monkeypatch.setenv("TMPDIR", str(tmp))
        run = host.run("node")
    assert run.code == 0, run.out
    run.line("tmpdir-disk", "ok",
             f"TMPDIR={tmp} is on tmpfs (tmpfs is RAM-backed), but the state directory is not under it")


def test_tmpdir_that_is_not_a_directory_fails(host, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(host.root / "gone"))
    run = host.run("node", "-json")
    assert run.code == 1
    result = {r["name"]: r for r in json.loads(run.out)}["tmpdir-disk"]
    assert result == {"name": "tmpdir-disk", "ok": False,
                      "found": f"TMPDIR={host.root / 'gone'} is not a directory", "fix": TMPDIR_FIX}


def test_overlay_writing_into_tmpfs_is_ram_backed(host) -> None:
    upper = host.root / "upper"
    lower = host.root / "lower"
    lower.mkdir()
    with host.tmpfs(upper, "16m"):
        (upper / "up").mkdir()
        (upper / "work").mkdir()
        with host.mount(host.state, "-t", "overlay", "-o",
                        f"lowerdir={lower},upperdir={upper / 'up'},workdir={upper / 'work'}", "overlay"):
            run = host.run("node")
    run.line("state-dir-disk", "FAIL", "is on overlay (overlay, mounted at "
             f"{host.state}): overlay writing into tmpfs (tmpfs is RAM-backed)", DISK_FIX)


def test_mount_points_with_spaces_and_bind_mounts_are_found(host) -> None:
    odd = host.root / "a dir\twith space"
    with host.tmpfs(odd):
        (odd / "inner").mkdir()
        found = mounts.mount_of(str(odd / "inner" / "not-yet"))
        assert (found.point, found.fstype) == (str(odd), "tmpfs")
        assert mounts.ram_backed(found) == "tmpfs is RAM-backed"
        bound = host.root / "bound"
        with host.mount(bound, "--bind", str(odd / "inner")):
            assert mounts.mount_of(str(bound)).fstype == "tmpfs"
    assert mounts.ram_backed(mounts.mount_of(str(odd))) is None


def test_a_state_dir_given_relative_is_made_absolute(host, monkeypatch) -> None:
    monkeypatch.chdir(host.root)
    ctx = context.Context(role="node", state_dir="state")
    assert ctx.state_path == str(host.state)
