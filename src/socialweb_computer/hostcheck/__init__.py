"""Host checks behind `socialweb-computer check-host`: can this host run the gateway or its nodes?

A gateway whose state directory sits on RAM, whose ports are taken or whose account is not
lingering fails late and far from the cause (a full filesystem halfway through a node boot,
a unit that dies at logout). These checks find such conditions before anything boots.

`checks.CHECKS` is the table (name, why, fix, run, roles) that the command prints and that
docs/host-contract.md documents row by row; a test keeps the two in step. The probes live
in one module per subject: `statedir` (directory, disk, space, TMPDIR), `tools` (mkfs.ext4,
QEMU, runc, containerd), `kvm`, `ports`, `account` (lingering, open-file limits), with
`mounts` telling which filesystem holds a path.
"""
