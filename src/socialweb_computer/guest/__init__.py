"""Guest images: what a microVM node boots (a kernel, an initramfs, an ext4 root filesystem).

    config.py     the image config (kernel, packages, vcpu, memMiB, rootfsMiB, files to stage)
                  and its fingerprint over every input
    build.py      the build: Debian packages through `debian.py`, a PVH vmlinux, the initramfs,
                  the root filesystem with `mkfs.ext4 -d`
    store.py      images in the state directory, content-addressed; ensure, build, prune
    cpio.py       the initramfs archive format
    scripts/      the guest's two init scripts (initramfs, then the root filesystem's PID 1)

The QEMU bidder (`bidders/qemu.py`) boots these images; docs/node.md has the whole story.
"""
