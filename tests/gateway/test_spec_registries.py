"""`registries:` in the gateway spec: how nodes pull (mirrors, plain HTTP, credentials by reference)."""

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
