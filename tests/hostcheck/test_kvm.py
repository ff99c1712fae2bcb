"""The kvm check is a finding, never a failure: it says whether nodes get KVM or boot under TCG."""

from __future__ import annotations

import os

import pytest

from socialweb_computer.hostcheck import context, kvm


def _ctx(tmp_path, device: str, flags: str | None = None) -> context.Context:
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    if flags is not None:
        (proc / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: fpu vme {flags} sse2\n\n")
    return context.Context(role="node", state_dir=str(tmp_path), kvm_device=device, proc=str(proc))


def test_no_device_means_tcg_and_the_line_stays_ok(host, monkeypatch) -> None:
    monkeypatch.setattr(context, "KVM_DEVICE", str(host.root / "kvm"))
    run = host.run("node")
    assert run.code == 0, run.out
    run.line("kvm", "ok", f"nodes boot under TCG (slower, no KVM): {host.root / 'kvm'} does not exist")


def test_a_device_that_is_not_kvm_means_tcg(tmp_path) -> None:
    kind, reason = kvm.acceleration(_ctx(tmp_path, os.devnull, "vmx"))
    assert kind == "tcg"
    assert reason.startswith(f"{os.devnull} does not work as KVM (")


def test_a_device_the_account_cannot_open_means_tcg(tmp_path) -> None:
    device = tmp_path / "kvm"
    device.mkdir()  # opening a directory read-write fails like a device without permission would
    kind, reason = kvm.acceleration(_ctx(tmp_path, str(device), "vmx"))
    assert (kind, reason) == ("tcg", f"cannot open {device}: Is a directory")


def _real_kvm_works() -> bool:
    return os.path.exists(context.KVM_DEVICE) and kvm._probe_device(context.KVM_DEVICE) is None


@pytest.mark.skipif(not _real_kvm_works(), reason="this machine has no /dev/kvm that answers the KVM API")
def test_a_working_device_counts_only_with_the_cpu_virtualisation_flag(tmp_path) -> None:
    assert kvm.acceleration(_ctx(tmp_path, context.KVM_DEVICE, "vmx")) == (
        "kvm", f"{context.KVM_DEVICE} answers KVM API 12 and creates VMs")
    assert kvm.acceleration(_ctx(tmp_path, context.KVM_DEVICE, "svm"))[0] == "kvm"
    kind, reason = kvm.acceleration(_ctx(tmp_path, context.KVM_DEVICE, "hypervisor"))
    assert kind == "tcg"
    assert "neither vmx nor svm" in reason
    check = kvm.check(_ctx(tmp_path, context.KVM_DEVICE, "vmx"))
    assert (check.ok, check.found) == (
        True, f"nodes get KVM acceleration: {context.KVM_DEVICE} answers KVM API 12 and creates VMs")
