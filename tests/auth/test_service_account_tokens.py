"""ServiceAccount tokens end to end: `kubectl create token`, the token as a bearer credential
held to RBAC, 401 for expired, forged, unbound and orphaned tokens, TokenReview, the OIDC
documents (verified with joserfc, a JOSE library independent of the one the server signs
with), key rotation that keeps live tokens valid, the legacy token Secret controller and the
kube-root-ca.crt publisher. Tokens must never reach the server's log."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from joserfc import jwk, jwt

from socialweb_computer import testing

NS = "tokens"
ISSUED: list[str] = []  # every token the tests saw, to prove none reached the log


@pytest.fixture(scope="module")
def server(auth_server: testing.ApiServerProcess) -> testing.ApiServerProcess:
    auth_server.kubectl("create", "namespace", NS)
    auth_server.kubectl("create", "serviceaccount", "deployer", "-n", NS)
    _wait(lambda: auth_server.kubectl("get", "sa", "default", "-n", NS, check=False).returncode == 0)
    return auth_server


def _wait(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def create_token(server: testing.ApiServerProcess, account: str, *args: str) -> str:
    token = server.kubectl("create", "token", account, "-n", NS, *args).stdout.strip()
    ISSUED.append(token)
    return token


def token_kubeconfig(server: testing.ApiServerProcess, token: str, path: Path) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "clusters": [
            {"name": "c", "cluster": {"server": server.url, "certificate-authority": str(server.ca_file)}}
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": NS}}],
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def kubectl_with(
    server: testing.ApiServerProcess, kubeconfig: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(testing.tool_path("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        env=server.tool_env(),
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def bearer(
    kit: Any, server: testing.ApiServerProcess, token: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    client = kit.Client(server, None)
    try:
        return client.request(method, path, body, {"Authorization": f"Bearer {token}"})
    finally:
        client.close()


def claims_of(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


UNAUTHORIZED = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}


# ---------------------------------------------------------------- kubectl create token, RBAC


def test_created_token_is_a_bearer_credential_held_to_rbac(
    server: testing.ApiServerProcess, tmp_path: Path
) -> None:
    token = create_token(server, "deployer")
    config = token_kubeconfig(server, token, tmp_path / "sa.kubeconfig")

    whoami = kubectl_with(server, config, "auth", "whoami", "-o", "json")
    assert whoami.returncode == 0, whoami.stderr
    info = json.loads(whoami.stdout)["status"]["userInfo"]
    assert info["username"] == f"system:serviceaccount:{NS}:deployer"
    assert info["groups"] == [
        "system:serviceaccounts",
        f"system:serviceaccounts:{NS}",
        "system:authenticated",
    ]
    uid = server.kubectl("get", "sa", "deployer", "-n", NS, "-o", "jsonpath={.metadata.uid}").stdout
    assert info["uid"] == uid
    assert info["extra"]["authentication.kubernetes.io/credential-id"] == [f"JTI={claims_of(token)['jti']}"]

    denied = kubectl_with(server, config, "get", "pods")
    assert denied.returncode == 1
    assert denied.stderr.strip() == (
        f'Error from server (Forbidden): pods is forbidden: User "system:serviceaccount:{NS}:deployer" '
        f'cannot list resource "pods" in API group "" in the namespace "{NS}"'
    )
    server.kubectl(
        "create",
        "rolebinding",
        "deployer-view",
        "-n",
        NS,
        "--clusterrole=view",
        f"--serviceaccount={NS}:deployer",
    )
    _wait(lambda: kubectl_with(server, config, "get", "pods").returncode == 0)
    assert kubectl_with(server, config, "get", "pods", "-n", "default").returncode == 1


def test_token_claims_and_defaults(server: testing.ApiServerProcess) -> None:
    token = create_token(server, "deployer", "--duration=30m", "--audience=vault", "--audience=ci")
    claims = claims_of(token)
    assert claims["iss"] == server.url
    assert claims["sub"] == f"system:serviceaccount:{NS}:deployer"
    assert claims["aud"] == ["vault", "ci"]
    assert claims["exp"] - claims["iat"] == 1800
    assert claims["nbf"] == claims["iat"]
    assert claims["kubernetes.io"]["namespace"] == NS
    assert claims["kubernetes.io"]["serviceaccount"]["name"] == "deployer"
    default = claims_of(create_token(server, "deployer"))
    assert default["aud"] == [server.url]
    assert default["exp"] - default["iat"] == 3600


def test_a_token_for_other_audiences_is_refused(server: testing.ApiServerProcess, kit: Any) -> None:
    token = create_token(server, "deployer", "--audience=vault")
    assert bearer(kit, server, token, "GET", "/api") == (401, UNAUTHORIZED)


def test_token_request_refusals_in_upstream_words(server: testing.ApiServerProcess, kit: Any) -> None:
    short = server.kubectl("create", "token", "deployer", "-n", NS, "--duration=5m", check=False)
    assert short.stderr.strip() == (
        'error: failed to create token: TokenRequest.authentication.k8s.io "" is invalid: '
        "spec.expirationSeconds: Invalid value: 300: may not specify a duration less than 10 minutes"
    )
    missing = server.kubectl("create", "token", "ghost", "-n", NS, check=False)
    assert missing.stderr.strip() == 'error: failed to create token: serviceaccounts "ghost" not found'
    admin = kit.Client(server)
    path = f"/api/v1/namespaces/{NS}/serviceaccounts/deployer/token"
    status, body = admin.request(
        "POST", path, {"spec": {"boundObjectRef": {"kind": "ConfigMap", "apiVersion": "v1", "name": "x"}}}
    )
    assert (status, body["message"]) == (400, "cannot bind token to object of type /v1, Kind=ConfigMap")
    status, body = admin.request("POST", path, {"metadata": {"name": "other"}})
    assert (status, body["message"]) == (
        422,
        'TokenRequest.authentication.k8s.io "deployer" is invalid: metadata.name: Invalid value: "other": '
        "must match the service account name if specified",
    )
    status, body = admin.request("GET", path)
    assert status == 405
    admin.close()


# ---------------------------------------------------------------- bound tokens


def _pod(server: testing.ApiServerProcess, name: str, account: str = "deployer") -> str:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"serviceAccountName": account, "containers": [{"name": "c", "image": "busybox"}]},
    }
    server.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    return server.kubectl("get", "pod", name, "-n", NS, "-o", "jsonpath={.metadata.uid}").stdout


def test_pod_bound_token_dies_with_its_pod(server: testing.ApiServerProcess, kit: Any) -> None:
    uid = _pod(server, "bound")
    token = create_token(server, "deployer", "--bound-object-kind=Pod", "--bound-object-name=bound")
    private = claims_of(token)["kubernetes.io"]
    assert private["pod"] == {"name": "bound", "uid": uid}
    status, body = bearer(
        kit,
        server,
        token,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert status == 201
    extra = body["status"]["userInfo"]["extra"]
    assert extra["authentication.kubernetes.io/pod-name"] == ["bound"]
    assert extra["authentication.kubernetes.io/pod-uid"] == [uid]
    server.kubectl("delete", "pod", "bound", "-n", NS)
    assert bearer(kit, server, token, "GET", "/api") == (401, UNAUTHORIZED)
    # A new pod of the same name has a new UID: the old token stays dead.
    _pod(server, "bound")
    assert bearer(kit, server, token, "GET", "/api") == (401, UNAUTHORIZED)


def test_pod_bound_request_from_a_node_agent(server: testing.ApiServerProcess, kit: Any) -> None:
    """What a kubelet sends to fill a projected volume: bound to the pod, 3607 s, API audiences."""
    server.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "token-node"}}),
    )
    node_uid = server.kubectl("get", "node", "token-node", "-o", "jsonpath={.metadata.uid}").stdout
    pod_uid = _pod(server, "on-node")
    admin = kit.Client(server)
    status, _ = admin.request(
        "POST",
        f"/api/v1/namespaces/{NS}/pods/on-node/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "on-node"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "token-node"},
        },
    )
    assert status == 201
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [server.url],
            "expirationSeconds": 3607,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "on-node", "uid": pod_uid},
        },
    }
    status, body = admin.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/deployer/token", request)
    assert status == 201, body
    assert body["kind"] == "TokenRequest"
    assert body["spec"]["expirationSeconds"] == 3607
    token = body["status"]["token"]
    ISSUED.append(token)
    claims = claims_of(token)
    assert claims["exp"] - claims["iat"] == 365 * 24 * 3600  # upstream's extended lifetime
    assert claims["kubernetes.io"]["warnafter"] - claims["iat"] == 3607
    assert claims["kubernetes.io"]["node"] == {"name": "token-node", "uid": node_uid}
    assert bearer(kit, server, token, "GET", "/version")[0] == 200
    request["spec"]["boundObjectRef"]["uid"] = "not-the-uid"
    status, body = admin.request("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/deployer/token", request)
    assert (status, body["message"]) == (
        409,
        'Operation cannot be fulfilled on Pod "on-node": the UID in the bound object reference '
        "(not-the-uid) does not match the UID in record. The object might have been deleted and then "
        "recreated",
    )
    wrong = server.kubectl(
        "create",
        "token",
        "default",
        "-n",
        NS,
        "--bound-object-kind=Pod",
        "--bound-object-name=on-node",
        check=False,
    )
    assert wrong.stderr.strip() == (
        "error: failed to create token: cannot bind token for serviceaccount "
        '"default" to pod running with different serviceaccount name.'
    )
    admin.close()


def test_secret_bound_token_and_deleted_service_account(server: testing.ApiServerProcess, kit: Any) -> None:
    server.kubectl("create", "secret", "generic", "anchor", "-n", NS)
    token = create_token(server, "deployer", "--bound-object-kind=Secret", "--bound-object-name=anchor")
    assert bearer(kit, server, token, "GET", "/version")[0] == 200
    server.kubectl("delete", "secret", "anchor", "-n", NS)
    assert bearer(kit, server, token, "GET", "/version") == (401, UNAUTHORIZED)

    server.kubectl("create", "serviceaccount", "short-lived", "-n", NS)
    token = create_token(server, "short-lived")
    assert bearer(kit, server, token, "GET", "/version")[0] == 200
    server.kubectl("delete", "serviceaccount", "short-lived", "-n", NS)
    assert bearer(kit, server, token, "GET", "/version") == (401, UNAUTHORIZED)
    server.kubectl("create", "serviceaccount", "short-lived", "-n", NS)  # same name, new UID
    assert bearer(kit, server, token, "GET", "/version") == (401, UNAUTHORIZED)


# ---------------------------------------------------------------- forged and expired tokens


def _server_key(server: testing.ApiServerProcess) -> tuple[str, jwk.ECKey]:
    directory = server.state_dir / "pki" / "service-account-keys"
    newest = sorted(directory.glob("sa-*.key"))[-1]
    key = jwk.ECKey.import_key(newest.read_bytes())
    jwks = json.loads(server.kubectl("get", "--raw", "/openid/v1/jwks").stdout)
    kid = next(k["kid"] for k in jwks["keys"] if k["x"] == key.as_dict()["x"])
    return kid, key


def _sign(claims: dict[str, Any], key: jwk.ECKey, kid: str) -> str:
    return jwt.encode({"alg": "ES256", "kid": kid}, claims, key)


def test_expired_and_forged_tokens_get_401(
    server: testing.ApiServerProcess, kit: Any, tmp_path: Path
) -> None:
    genuine = claims_of(create_token(server, "deployer"))
    kid, key = _server_key(server)
    now = int(time.time())
    expired = _sign({**genuine, "iat": now - 7200, "nbf": now - 7200, "exp": now - 3600}, key, kid)
    assert bearer(kit, server, expired, "GET", "/version") == (401, UNAUTHORIZED)
    future = _sign({**genuine, "iat": now + 3600, "nbf": now + 3600, "exp": now + 7200}, key, kid)
    assert bearer(kit, server, future, "GET", "/version") == (401, UNAUTHORIZED)
    still_good = _sign({**genuine, "jti": str(uuid.uuid4())}, key, kid)
    assert bearer(kit, server, still_good, "GET", "/version")[0] == 200
    foreign = _sign(genuine, jwk.ECKey.generate_key("P-256"), kid)
    assert bearer(kit, server, foreign, "GET", "/version") == (401, UNAUTHORIZED)
    assert bearer(kit, server, "not-a-jwt", "GET", "/version") == (401, UNAUTHORIZED)
    ISSUED.extend([expired, future, still_good, foreign])

    config = token_kubeconfig(server, expired, tmp_path / "expired.kubeconfig")
    result = kubectl_with(server, config, "get", "pods")
    assert result.returncode == 1
    assert "error: You must be logged in to the server" in result.stderr
    log = server.stderr_path.read_text() + server.stdout_path.read_text()
    assert "[invalid bearer token, service account token has expired]" in log


def test_a_bad_certificate_with_a_good_token_authenticates_as_the_token(
    server: testing.ApiServerProcess, kit: Any
) -> None:
    from socialweb_computer.auth import pki

    stranger = kit.mint(server, "stranger", "stranger", ca=pki.new_ca("someone else"))
    token = create_token(server, "deployer")
    client = kit.Client(server, stranger)
    assert client.request("GET", "/version")[0] == 401
    status, body = client.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        {"Authorization": f"Bearer {token}"},
    )
    client.close()
    assert (status, body["status"]["userInfo"]["username"]) == (201, f"system:serviceaccount:{NS}:deployer")
    # A valid certificate wins over a token, as kube-apiserver's authenticator order has it.
    admin = kit.Client(server)
    status, body = admin.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        {"Authorization": f"Bearer {token}"},
    )
    admin.close()
    assert body["status"]["userInfo"]["username"] == "system:admin"


# ---------------------------------------------------------------- TokenReview


def test_token_review(server: testing.ApiServerProcess, kit: Any) -> None:
    token = create_token(server, "deployer", "--audience=vault")
    admin = kit.Client(server)
    path = "/apis/authentication.k8s.io/v1/tokenreviews"
    review = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token, "audiences": ["vault"]},
    }
    status, body = admin.request("POST", path, review)
    assert status == 201
    assert body["kind"] == "TokenReview"
    assert body["status"]["authenticated"] is True
    assert body["status"]["audiences"] == ["vault"]
    assert body["status"]["user"]["username"] == f"system:serviceaccount:{NS}:deployer"
    review["spec"]["audiences"] = []
    status, body = admin.request("POST", path, review)
    assert body["status"] == {
        "user": {},
        "error": f'[invalid bearer token, token audiences ["vault"] is invalid '
        f'for the target audiences ["{server.url}"]]',
    }
    status, body = admin.request(
        "POST", path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {}}
    )
    assert (status, body["message"]) == (400, "token is required for TokenReview in authentication.k8s.io")
    admin.close()
    # Who may review: system:auth-delegator (unbound by default), not a plain service account.
    other = create_token(server, "deployer")
    status, body = bearer(kit, server, other, "POST", path, review)
    assert status == 403
    assert body["message"] == (
        f'tokenreviews.authentication.k8s.io is forbidden: User "system:serviceaccount:{NS}'
        ':deployer" cannot create resource "tokenreviews" in API group '
        '"authentication.k8s.io" at the cluster scope'
    )


# ---------------------------------------------------------------- OIDC discovery


def test_oidc_documents_verify_tokens(server: testing.ApiServerProcess, kit: Any) -> None:
    token = create_token(server, "deployer")
    status, discovery = bearer(kit, server, token, "GET", "/.well-known/openid-configuration")
    assert status == 200
    assert discovery == {
        "issuer": server.url,
        "jwks_uri": f"{server.url}/openid/v1/jwks",
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
    }
    status, keys = bearer(kit, server, token, "GET", "/openid/v1/jwks")
    assert status == 200
    key_set = jwk.KeySet.import_key_set(keys)
    verified = jwt.decode(token, key_set, algorithms=["ES256"])
    jwt.JWTClaimsRegistry(
        iss={"essential": True, "value": discovery["issuer"]}, aud={"essential": True, "value": server.url}
    ).validate(verified.claims)
    assert verified.claims["sub"] == f"system:serviceaccount:{NS}:deployer"
    # Anonymous clients do not get them (upstream binds the role to system:serviceaccounts only).
    anonymous = kit.Client(server, None)
    status, body = anonymous.request("GET", "/openid/v1/jwks")
    anonymous.close()
    assert (status, body["message"]) == (
        403,
        'forbidden: User "system:anonymous" cannot get path "/openid/v1/jwks"',
    )


def test_discovery_headers(server: testing.ApiServerProcess) -> None:
    import http.client

    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=server.ssl_context(), timeout=10
    )
    connection.request("GET", "/openid/v1/jwks")
    response = connection.getresponse()
    response.read()
    connection.close()
    assert response.getheader("Content-Type") == "application/jwk-set+json"
    assert response.getheader("Cache-Control") == "public, max-age=3600"


# ---------------------------------------------------------------- rotation


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "socialweb_computer", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_rotation_keeps_live_tokens_valid(server: testing.ApiServerProcess, kit: Any) -> None:
    directory = server.state_dir / "pki" / "service-account-keys"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    before = create_token(server, "deployer")
    rotated = _cli("credential", "rotate-service-account-key", "--state-dir", str(server.state_dir))
    assert rotated.returncode == 0, rotated.stderr
    assert rotated.stdout.startswith("new signing key ")
    files = sorted(directory.glob("sa-*.key"))
    assert len(files) >= 2
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    after = create_token(server, "deployer")
    header = lambda t: json.loads(base64.urlsafe_b64decode(t.split(".")[0] + "=="))  # noqa: E731
    assert header(after)["kid"] != header(before)["kid"]
    assert header(after)["kid"] == rotated.stdout.split()[3].rstrip(";")
    assert bearer(kit, server, before, "GET", "/version")[0] == 200
    assert bearer(kit, server, after, "GET", "/version")[0] == 200
    kids = [k["kid"] for k in json.loads(server.kubectl("get", "--raw", "/openid/v1/jwks").stdout)["keys"]]
    assert header(before)["kid"] in kids and header(after)["kid"] in kids

    retired = _cli(
        "credential", "rotate-service-account-key", "--state-dir", str(server.state_dir), "--retire"
    )
    assert retired.returncode == 0, retired.stderr
    assert bearer(kit, server, before, "GET", "/version") == (401, UNAUTHORIZED)
    assert bearer(kit, server, after, "GET", "/version")[0] == 200
    unknown = _cli(
        "credential", "rotate-service-account-key", "--state-dir", str(server.state_dir), "--cluster", "nope"
    )
    assert unknown.returncode == 1
    assert "--cluster: no cluster 'nope'" in unknown.stderr


# ---------------------------------------------------------------- legacy Secrets, root CA


def _secret_data(server: testing.ApiServerProcess, name: str) -> dict[str, str]:
    out = server.kubectl("get", "secret", name, "-n", NS, "-o", "json", check=False)
    if out.returncode:
        return {}
    return {k: base64.b64decode(v).decode() for k, v in (json.loads(out.stdout).get("data") or {}).items()}


def test_legacy_token_secret_is_filled_and_dies_with_its_account(
    server: testing.ApiServerProcess, kit: Any
) -> None:
    server.kubectl("create", "serviceaccount", "legacy", "-n", NS)
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": "legacy-token",
            "namespace": NS,
            "annotations": {"kubernetes.io/service-account.name": "legacy"},
        },
    }
    server.kubectl("apply", "-f", "-", input=json.dumps(secret))
    _wait(lambda: "token" in _secret_data(server, "legacy-token"))
    data = _secret_data(server, "legacy-token")
    ISSUED.append(data["token"])
    assert data["namespace"] == NS
    assert data["ca.crt"] == server.ca_file.read_text()
    claims = claims_of(data["token"])
    assert claims["iss"] == "kubernetes/serviceaccount"
    assert claims["kubernetes.io/serviceaccount/secret.name"] == "legacy-token"
    assert "exp" not in claims
    uid = server.kubectl("get", "sa", "legacy", "-n", NS, "-o", "jsonpath={.metadata.uid}").stdout
    annotations = json.loads(
        server.kubectl(
            "get", "secret", "legacy-token", "-n", NS, "-o", "jsonpath={.metadata.annotations}"
        ).stdout
    )
    assert annotations["kubernetes.io/service-account.uid"] == uid
    status, body = bearer(
        kit,
        server,
        data["token"],
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert (status, body["status"]["userInfo"]["username"]) == (201, f"system:serviceaccount:{NS}:legacy")
    server.kubectl("delete", "serviceaccount", "legacy", "-n", NS)
    _wait(lambda: server.kubectl("get", "secret", "legacy-token", "-n", NS, check=False).returncode == 1)
    assert bearer(kit, server, data["token"], "GET", "/version") == (401, UNAUTHORIZED)


def test_token_secret_for_a_missing_account_is_removed(server: testing.ApiServerProcess) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/service-account-token",
        "metadata": {
            "name": "orphan-token",
            "namespace": NS,
            "annotations": {"kubernetes.io/service-account.name": "nobody"},
        },
    }
    server.kubectl("apply", "-f", "-", input=json.dumps(secret))
    _wait(lambda: server.kubectl("get", "secret", "orphan-token", "-n", NS, check=False).returncode == 1)


def test_root_ca_configmap_in_every_namespace(server: testing.ApiServerProcess) -> None:
    ca = server.ca_file.read_text()
    for namespace in ("default", "kube-system", "kube-public", NS):
        data = server.kubectl(
            "get", "configmap", "kube-root-ca.crt", "-n", namespace, "-o", "jsonpath={.data.ca\\.crt}"
        ).stdout
        assert data == ca, namespace
    server.kubectl("create", "namespace", "fresh-ca")
    _wait(
        lambda: server.kubectl("get", "cm", "kube-root-ca.crt", "-n", "fresh-ca", check=False).returncode == 0
    )
    server.kubectl("delete", "configmap", "kube-root-ca.crt", "-n", "fresh-ca")
    _wait(
        lambda: server.kubectl("get", "cm", "kube-root-ca.crt", "-n", "fresh-ca", check=False).returncode == 0
    )
    server.kubectl(
        "patch",
        "configmap",
        "kube-root-ca.crt",
        "-n",
        "fresh-ca",
        "--type=merge",
        "-p",
        '{"data":{"ca.crt":"tampered"}}',
    )
    _wait(
        lambda: (
            server.kubectl(
                "get", "cm", "kube-root-ca.crt", "-n", "fresh-ca", "-o", "jsonpath={.data.ca\\.crt}"
            ).stdout
            == ca
        )
    )
    description = server.kubectl(
        "get",
        "cm",
        "kube-root-ca.crt",
        "-n",
        "fresh-ca",
        "-o",
        "jsonpath={.metadata.annotations.kubernetes\\.io/description}",
    ).stdout
    assert description.startswith("Contains a CA bundle that can be used to verify the kube-apiserver")


def test_tokens_never_reach_the_log(server: testing.ApiServerProcess, tmp_path: Path) -> None:
    """Every token this process saw is absent from the server's output: the tests that ran before
    it here (the whole module when it runs serially, some of it on a parallel worker) and one it
    issues and authenticates with itself, so the check never depends on what ran before."""
    token = create_token(server, "deployer")
    kubectl_with(server, token_kubeconfig(server, token, tmp_path / "token.kubeconfig"), "get", "pods")
    log = server.stderr_path.read_text() + server.stdout_path.read_text()
    for token in ISSUED:
        assert token not in log
        assert token.split(".")[2] not in log  # not even the signature


def test_key_files_mode(server: testing.ApiServerProcess) -> None:
    for path in (server.state_dir / "pki" / "service-account-keys").iterdir():
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
