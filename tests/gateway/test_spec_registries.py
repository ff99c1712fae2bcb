"""The gateway spec's `registries` and `guestImage`, and the bidders `gateway/bidding.py` builds from them."""

from __future__ import annotations

import pytest

from socialweb_computer.gateway import spec as spec_mod
from socialweb_computer.node import config as node_config
from socialweb_computer.node import containerd


def test_registries_become_node_registry_configs_credentials_and_host_ports() -> None:
    spec = spec_mod.parse(
        {
            "registries": [
                {"host": "127.0.0.1:5000"},
                {"host": "registry.example.com", "mirrors": ["https://mirror.example.com",
                                                          "http://127.0.0.1:5001"],
                 "credentialsEnv": "EXAMPLE_REGISTRY_AUTH"},
                {"host": "internal.example:8443", "skipVerify": True, "plainHTTP": False},
            ]
        }
    )
    local, example, internal = spec.registries
    assert local.plain_http and local.endpoint == "http://127.0.0.1:5000"
    assert not example.plain_http and example.endpoint == "https://registry.example.com"
    assert internal.skip_verify and internal.endpoint == "https://internal.example:8443"
    configs, credentials, ports = spec_mod.node_registries(spec, {"EXAMPLE_REGISTRY_AUTH": "puller:s3cret"})
    assert configs[1] == node_config.RegistryConfig(
        host="registry.example.com", endpoint="https://registry.example.com",
        mirrors=("https://mirror.example.com", "http://127.0.0.1:5001"),
    )
    assert credentials == {"registry.example.com": ("puller", "s3cret")}
    assert ports == [5000, 5001], "loopback registries and mirrors are forwarded into the node"


def test_a_credential_reference_that_does_not_resolve_is_an_error_naming_it() -> None:
    spec = spec_mod.parse({"registries": [{"host": "r.example", "credentialsEnv": "R_AUTH"}]})
    with pytest.raises(spec_mod.SpecError, match=r"credentialsEnv names \$R_AUTH, which is unset"):
        spec_mod.node_registries(spec, {})
    with pytest.raises(spec_mod.SpecError, match="not \"username:password\""):
        spec_mod.node_registries(spec, {"R_AUTH": "no-colon"})


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"host": "r.example", "mirrors": "https://m"}, "mirrors: expected a list of URLs"),
        ({"host": "r.example", "plainHttp": True}, "unknown field 'plainHttp'"),
        ({"host": "r.example", "credentialsEnv": "not a name"}, "credentialsEnv: expected the name"),
        ({"host": "https://r.example"}, "host: expected a registry host"),
        ({"host": "r.example", "skipVerify": "yes"}, "skipVerify: expected true or false"),
    ],
)
def test_bad_registry_entries_are_refused(entry: dict, message: str) -> None:
    with pytest.raises(spec_mod.SpecError, match=message):
        spec_mod.parse({"registries": [entry]})


def test_hosts_toml_tries_the_mirrors_first_then_the_registry() -> None:
    text = containerd.render_hosts_toml(
        containerd.Registry("registry.example.com", "https://registry.example.com",
                            mirrors=("https://mirror.example.com",))
    )
    assert text == (
        'server = "https://registry.example.com"\n\n'
        '[host."https://mirror.example.com"]\n  capabilities = ["pull", "resolve"]\n\n'
        '[host."https://registry.example.com"]\n  capabilities = ["pull", "resolve"]\n'
    )


def test_guest_image_is_the_image_config_without_sizes(tmp_path) -> None:
    (tmp_path / "ca.pem").write_text("a corporate CA\n")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        "guestImage:\n  packages: [git]\n  files:\n    - {source: ca.pem, path: /usr/local/share/ca.pem}\n"
    )
    image = spec_mod.load(str(spec_file)).guest_image
    assert image.packages == ("git",) and image.files[0].source == tmp_path / "ca.pem"
    assert spec_mod.GatewaySpec().guest_image == spec_mod.guest_config.ImageConfig()
    refused = r"guestImage.memMiB: a node's size is not part of guestImage; set nodeDefaults.memMiB"
    with pytest.raises(spec_mod.SpecError, match=refused):
        spec_mod.parse({"guestImage": {"memMiB": 4096}})
    with pytest.raises(spec_mod.SpecError, match="guestImage: unknown field 'packges'"):
        spec_mod.parse({"guestImage": {"packges": ["git"]}})


def test_make_bidder_configures_both_bidders_from_the_spec(tmp_path) -> None:
    from socialweb_computer.bidders import qemu, sandbox
    from socialweb_computer.gateway import bidding

    spec = spec_mod.parse({
        "registries": [{"host": "127.0.0.1:5000", "credentialsEnv": "LOCAL_AUTH"}],
        "guestImage": {"packages": ["git"]},
    })
    env = {"LOCAL_AUTH": "puller:s3cret"}
    box = bidding.make_bidder("sandbox", tmp_path, spec, host_ports=[7000], env=env)
    assert isinstance(box, sandbox.SandboxBidder)
    assert box.host_ports == [5000, 7000]
    assert box.registry_credentials == {"127.0.0.1:5000": ("puller", "s3cret")}
    vm = bidding.make_bidder("qemu", tmp_path, spec, env=env, owner_pid=1)
    assert isinstance(vm, qemu.QemuBidder)
    assert vm.image.packages == ("git",) and vm.owner.startswith("1:") and vm.host_ports == [5000]
    assert [r.endpoint for r in vm.registries] == ["http://127.0.0.1:5000"]
    with pytest.raises(spec_mod.SpecError, match=r"\$LOCAL_AUTH"):
        bidding.make_bidder("qemu", tmp_path, spec, env={})
    with pytest.raises(ValueError, match="unknown bidder 'vmware'"):
        bidding.make_bidder("vmware", tmp_path, spec)
