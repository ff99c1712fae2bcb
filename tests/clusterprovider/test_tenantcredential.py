"""`internal tenantcredential`, `credential mint` and the Python function: what they write and refuse.

A state directory is laid out exactly as the gateway writes it (layout.StateLayout), so
these run without a gateway; tests/gateway covers the same commands against a live one.
"""

from __future__ import annotations

import datetime
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from socialweb_computer import clusterprovider
from socialweb_computer.clusterprovider import layout

URL = "https://127.0.0.1:16444"


@pytest.fixture
def state(tmp_path: Path) -> Path:
    root = tmp_path / "state"
    layout.StateLayout(str(root)).create_cluster(layout.ClusterRecord("ci", "uid-1", 16444, URL))
    return root


def env_for(state: Path, out_dir: Path, **overrides: str | None) -> dict[str, str]:
    values: dict[str, str | None] = {
        "STATE_DIR": str(state),
        "CLUSTER": "ci",
        "SERVER": URL,
        "COMMON_NAME": "gitlab-runner",
        "ORGANIZATIONS": "gitlab-runner",
        "OUT_DIR": str(out_dir),
        "VALID_FOR": "720h",
        **overrides,
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith("SOCIALWEB_TENANTCREDENTIAL_")}
    return {**base, **{f"SOCIALWEB_TENANTCREDENTIAL_{k}": v for k, v in values.items() if v is not None}}


# A hang guard, not a measure: the command takes a second or two on an idle machine, many times
# that while the suite's other workers and other runs load it.
CLI_TIMEOUT = 120


def tenantcredential(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "socialweb_computer", "internal", "tenantcredential"],
        capture_output=True,
        text=True,
        env=env,
        timeout=CLI_TIMEOUT,
        check=False,
    )


def test_writes_three_private_files_signed_by_the_cluster_client_ca(state: Path, tmp_path: Path) -> None:
    out = tmp_path / "etc" / "tenant-ci"
    result = tenantcredential(env_for(state, out, ORGANIZATIONS="gitlab-runner,ci-jobs"))
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == ["ca.crt", "tls.crt", "tls.key"]
    for name in ("ca.crt", "tls.crt", "tls.key"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gitlab-runner"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
        "gitlab-runner",
        "ci-jobs",
    ]
    lifetime = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(hours=719) < lifetime <= datetime.timedelta(hours=720)
    pki_dir = state / "clusters" / "ci" / "pki"
    client_ca = x509.load_pem_x509_certificate((pki_dir / "client-ca.crt").read_bytes())
    cert.verify_directly_issued_by(client_ca)
    assert (out / "ca.crt").read_bytes() == (pki_dir / "serving-ca.crt").read_bytes()
    openssl = subprocess.run(
        ["openssl", "x509", "-in", str(out / "tls.crt"), "-noout", "-subject"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert openssl.stdout == "subject=O = gitlab-runner, O = ci-jobs, CN = gitlab-runner\n"


def test_default_validity_is_the_client_ca_remaining_validity(state: Path, tmp_path: Path) -> None:
    credential = clusterprovider.mint_tenant_credential_for_cluster_as(
        state_dir=str(state),
        cluster="ci",
        server=URL + "/",
        common_name="u",
        organizations=(),
        out_dir=str(tmp_path / "o"),
    )
    client_ca = x509.load_pem_x509_certificate((state / "clusters/ci/pki/client-ca.crt").read_bytes())
    assert abs(credential.not_after - client_ca.not_valid_after_utc) < datetime.timedelta(seconds=5)


@pytest.mark.parametrize(
    ("override", "variable", "words"),
    [
        ({"CLUSTER": "nope"}, "CLUSTER", "no cluster 'nope' in"),
        ({"SERVER": "https://127.0.0.1:9"}, "SERVER", f"cluster 'ci' is served at {URL}"),
        ({"SERVER": ""}, "SERVER", "is empty, but cluster 'ci' is served at"),
        ({"COMMON_NAME": ""}, "COMMON_NAME", "is empty; the CommonName is the username"),
        ({"ORGANIZATIONS": "gitlab-runner,system:masters"}, "ORGANIZATIONS", "contains system:masters"),
        ({"ORGANIZATIONS": "a,,b"}, "ORGANIZATIONS", "has an empty entry"),
        ({"VALID_FOR": "100000h"}, "VALID_FOR", "is longer than the cluster's ClientCA remains valid"),
        ({"VALID_FOR": "30 days"}, "VALID_FOR", "is not a duration. Use Go's syntax"),
        ({"VALID_FOR": "0"}, "VALID_FOR", "is not a positive duration"),
        ({"STATE_DIR": "/nonexistent-state"}, "STATE_DIR", "is not a directory"),
        ({"OUT_DIR": None}, "OUT_DIR", "is not set"),
        ({"CLUSTER": None}, "CLUSTER", "is not set"),
    ],
)
def test_refusals_name_the_variable_and_write_nothing(
    state: Path, tmp_path: Path, override: dict, variable: str, words: str
) -> None:
    out = tmp_path / "out"
    result = tenantcredential(env_for(state, out, **override))
    assert result.returncode == 1
    assert result.stderr.startswith(f"error: SOCIALWEB_TENANTCREDENTIAL_{variable}"), result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_never_overwrites_and_writes_nothing_when_one_file_exists(state: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "tls.key").write_text("old key")
    result = tenantcredential(env_for(state, out))
    assert result.returncode == 1
    assert "SOCIALWEB_TENANTCREDENTIAL_OUT_DIR" in result.stderr
    assert "move the old files aside" in result.stderr
    assert sorted(os.listdir(out)) == ["tls.key"] and (out / "tls.key").read_text() == "old key"


def test_credential_mint_writes_a_kubeconfig(state: Path, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "runner.kubeconfig"
    result = subprocess.run(
        [sys.executable, "-m", "socialweb_computer", "credential", "mint", "--state-dir", str(state),
         "--cluster", "ci", "--user", "gitlab-runner", "--group", "gitlab-runner",
         "--out-dir", str(tmp_path / "o"), "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
    assert f"server: {URL}" in kubeconfig.read_text()
    refused = subprocess.run(
        [sys.executable, "-m", "socialweb_computer", "credential", "mint", "--state-dir", str(state),
         "--cluster", "ci", "--user", "x", "--group", "system:masters", "--out-dir", str(tmp_path / "p")],
        capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False,
    )  # fmt: skip
    assert refused.returncode == 1 and refused.stderr.startswith("error: --group: contains system:masters")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("720h", 720 * 3600), ("1h30m", 5400), ("1.5h", 5400), ("90s", 90), ("250ms", 0.25), ("0", 0)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert clusterprovider.parse_go_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "h", "30", "30d", "-1h", "1h 30m"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ValueError):
        clusterprovider.parse_go_duration(text)
