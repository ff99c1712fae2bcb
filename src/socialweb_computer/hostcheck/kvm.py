"""Which acceleration nodes get: KVM when /dev/kvm really works, otherwise TCG (emulation).

Not a failure either way: QEMU boots nodes under TCG, only slower. Opening the device is not
enough to say KVM works, so the probe asks the API version, creates (and drops) an empty VM,
and looks for the CPU's virtualisation flag: a virtualised host that hides vmx/svm can still
offer /dev/kvm, yet fail to boot a stock kernel on it. The bidder may call `acceleration`
to choose `-accel` the same way.
"""

from __future__ import annotations

import fcntl
import os

from socialweb_computer.hostcheck import context

KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01
KVM_API_VERSION = 12  # The only stable KVM API version since Linux 2.6.22.
VIRTUALISATION_FLAGS = frozenset({"vmx", "svm"})


def _cpu_flags(proc: str) -> set[str]:
    try:
        with open(os.path.join(proc, "cpuinfo"), encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def _probe_device(device: str) -> str | None:
    """None when the device answers as KVM and creates a VM; otherwise why not."""
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return f"{device} does not exist"
    except OSError as e:
        return f"cannot open {device}: {e.strerror}"
    try:
        version = fcntl.ioctl(fd, KVM_GET_API_VERSION)
        if version != KVM_API_VERSION:
            return f"{device} answers KVM API version {version}, not {KVM_API_VERSION}"
        os.close(fcntl.ioctl(fd, KVM_CREATE_VM, 0))
    except OSError as e:
        return f"{device} does not work as KVM ({e.strerror})"
    finally:
        os.close(fd)
    return None


def acceleration(ctx: context.Context) -> tuple[str, str]:
    """("kvm" or "tcg", the reason in words)."""
    problem = _probe_device(ctx.kvm_device)
    if problem:
        return "tcg", problem
    if not VIRTUALISATION_FLAGS & _cpu_flags(ctx.proc):
        return "tcg", (f"{ctx.kvm_device} answers, but the CPU advertises neither vmx nor svm "
                       "(KVM nested without hardware support is not trusted to boot a stock kernel)")
    return "kvm", f"{ctx.kvm_device} answers KVM API {KVM_API_VERSION} and creates VMs"


def check(ctx: context.Context) -> context.Finding:
    kind, reason = acceleration(ctx)
    if kind == "kvm":
        return context.ok(f"nodes get KVM acceleration: {reason}")
    return context.ok(f"nodes boot under TCG (slower, no KVM): {reason}")
