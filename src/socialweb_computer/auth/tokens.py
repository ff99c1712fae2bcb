"""ServiceAccount token signing keys and JWTs: what signs a token, and what proves it was us.

A cluster's tokens are ES256 JWTs (the algorithm kube-apiserver uses with an ECDSA
`--service-account-signing-key-file`). The keys live in one directory of the cluster's
state (0700), one PEM file per key (0600), named by when it was made:

    pki/service-account-keys/sa-20260101T120000.000000Z.key

The newest key signs; every key in the directory verifies, so a rotation (a new newest
key) never invalidates a token that is still live, and the JWKS document lists every key
a relying party may meet. A retired key leaves the directory only when an operator says so
(`credential rotate-service-account-key --retire`), because legacy Secret tokens never
expire. The directory is re-read when it changes, so a rotation reaches a running server
without a restart. Key ids are upstream's: base64url(SHA-256(DER public key)).

Signing and verifying go through PyJWT; this module adds the key set and the parsing
that tells "a token that is not ours" from "our token, but invalid" (which is a 401).
Used by `auth.serviceaccounts` (issuing and authenticating) and the CLI (rotation).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import os
import threading
from typing import Any

import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from socialweb_computer.auth import pki

ALGORITHM = "ES256"
KEYS_DIRECTORY = "service-account-keys"
_PREFIX, _SUFFIX = "sa-", ".key"
_STAMP = "%Y%m%dT%H%M%S.%fZ"
_VERIFIED_CACHE = 4096  # tokens whose signature was checked, until the key set changes


class NotOurs(Exception):
    """Not a JWT, or not one of this cluster's issuers: another authenticator's business."""


class TokenInvalid(Exception):
    """One of our tokens that must not authenticate; the message says why (for the log)."""


def key_id(public_key: ec.EllipticCurvePublicKey) -> str:
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _b64(hashlib.sha256(der).digest())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _int_b64(value: int) -> str:
    return _b64(value.to_bytes(32, "big"))


@dataclasses.dataclass(frozen=True)
class SigningKey:
    kid: str
    private_key: ec.EllipticCurvePrivateKey
    created: str  # the file's stamp, for `rotate` to report

    @property
    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self.private_key.public_key()

    def jwk(self) -> dict[str, str]:
        numbers = self.public_key.public_numbers()
        return {"use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": ALGORITHM,
                "x": _int_b64(numbers.x), "y": _int_b64(numbers.y)}


def _new_key(created: str) -> SigningKey:
    private = ec.generate_private_key(ec.SECP256R1())
    return SigningKey(key_id(private.public_key()), private, created)


def _stamp(now: datetime.datetime | None = None) -> str:
    return (now or datetime.datetime.now(datetime.UTC)).strftime(_STAMP)


class KeySet:
    """The signing keys of one cluster: a directory, or (directory None) one key in memory."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._keys: list[SigningKey] = []  # oldest first
        self._seen: tuple[int, int] | None = None
        self._verified: dict[str, dict[str, Any]] = {}
        if directory is None:
            self._keys = [_new_key(_stamp())]

    @classmethod
    def ensure(cls, directory: str, *, sync: bool = True) -> KeySet:
        """The key set in `directory`, with a first key made (0600) if it has none."""
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _key_files(directory):
            _write_key(directory, _new_key(_stamp()), sync=sync)
        keys = cls(directory)
        keys.refresh()
        return keys

    # ------------------------------------------------------------------ reading

    def refresh(self) -> None:
        """Re-read the directory if it changed since the last look (one stat when it did not)."""
        if self.directory is None:
            return
        try:
            info = os.stat(self.directory)
        except FileNotFoundError:
            return
        seen = (info.st_mtime_ns, info.st_ino)
        if seen == self._seen:
            return
        with self._lock:
            keys = [_read_key(self.directory, name) for name in _key_files(self.directory)]
            if keys:
                self._keys = keys
                self._seen = seen
                self._verified = {}  # a retired key must not keep verifying through the cache

    @property
    def signing_key(self) -> SigningKey:
        self.refresh()
        if not self._keys:
            raise TokenInvalid("no service account signing key is configured")
        return self._keys[-1]

    def verifying_keys(self) -> dict[str, ec.EllipticCurvePublicKey]:
        self.refresh()
        return {k.kid: k.public_key for k in self._keys}

    def keys(self) -> list[SigningKey]:
        self.refresh()
        return list(self._keys)

    def jwks(self) -> dict[str, Any]:
        """The JSON Web Key Set `/openid/v1/jwks` serves: every key that verifies."""
        return {"keys": [k.jwk() for k in self.keys()]}

    # ------------------------------------------------------------------ rotation

    def rotate(self) -> SigningKey:
        """Make a new key the signer; the old ones keep verifying."""
        if self.directory is None:
            key = _new_key(_stamp())
            self._keys.append(key)
            return key
        stamp = _stamp()
        if self._keys and stamp <= self._keys[-1].created:  # the newest must sort last
            previous = datetime.datetime.strptime(self._keys[-1].created, _STAMP)
            stamp = _stamp(previous + datetime.timedelta(microseconds=1))
        key = _new_key(stamp)
        _write_key(self.directory, key)
        self._seen = None
        self.refresh()
        return key

    def retire(self) -> list[SigningKey]:
        """Remove every key but the signer; tokens they signed stop verifying. Returns them."""
        keys = self.keys()
        retired = keys[:-1]
        for key in retired:
            if self.directory is not None:
                os.unlink(os.path.join(self.directory, f"{_PREFIX}{key.created}{_SUFFIX}"))
        if self.directory is None:
            self._keys = keys[-1:]
            self._verified = {}
        self._seen = None
        self.refresh()
        return retired

    # ------------------------------------------------------------------ tokens

    def sign(self, claims: dict[str, Any]) -> str:
        key = self.signing_key
        return jwt.encode(claims, key.private_key, algorithm=ALGORITHM, headers={"kid": key.kid, "typ": None})

    def verify(self, token: str, issuers: tuple[str, ...]) -> dict[str, Any]:
        """The claims of a token we signed; NotOurs for tokens of other issuers or not JWTs.

        Only the signature is checked here; times, audiences and bound objects are the
        caller's (they need the clock and the store, and upstream's wording). A signature is
        checked once per token and key set (ECDSA verification is the costly part).
        """
        self.refresh()
        cached = self._verified.get(token)
        if cached is not None:
            if cached.get("iss") not in issuers:
                raise NotOurs()
            return dict(cached)
        header, unverified = _unverified(token)
        if unverified.get("iss") not in issuers:
            raise NotOurs()
        if header.get("alg") != ALGORITHM:
            raise TokenInvalid(f"unexpected signature algorithm {header.get('alg')!r}")
        keys = self.verifying_keys()
        candidates = [keys[header["kid"]]] if header.get("kid") in keys else list(keys.values())
        for public_key in candidates:
            try:
                claims = jwt.decode(token, public_key, algorithms=[ALGORITHM],
                                    options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                                             "verify_aud": False, "verify_iss": False})
            except jwt.InvalidSignatureError:
                continue
            except jwt.PyJWTError as e:
                raise TokenInvalid(str(e)) from None
            if len(self._verified) >= _VERIFIED_CACHE:
                self._verified.clear()
            self._verified[token] = claims
            return dict(claims)
        raise TokenInvalid("square/go-jose: error in cryptographic primitive")


def _unverified(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and claims of a compact JWS, unverified; NotOurs for anything else."""
    parts = token.split(".")
    if len(parts) != 3:
        raise NotOurs()
    try:
        header, claims = (orjson.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))) for p in parts[:2])
    except (ValueError, orjson.JSONDecodeError):
        raise NotOurs() from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise NotOurs()
    return header, claims


def _key_files(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(_PREFIX) and n.endswith(_SUFFIX))


def _read_key(directory: str, name: str) -> SigningKey:
    with open(os.path.join(directory, name), "rb") as f:
        private = serialization.load_pem_private_key(f.read(), password=None)
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{name}: expected an ECDSA P-256 private key")
    return SigningKey(key_id(private.public_key()), private, name[len(_PREFIX):-len(_SUFFIX)])


def _write_key(directory: str, key: SigningKey, *, sync: bool = True) -> None:
    pem = key.private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    pki.write_private(os.path.join(directory, f"{_PREFIX}{key.created}{_SUFFIX}"), pem, sync=sync)
