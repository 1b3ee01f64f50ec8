"""Signed artifacts: an Ed25519 signature over the manifest, which holds every file's SHA-256.

An artifact is code: its host library is a native shared library that runs with the loading
process's rights, as any shared library or pickle does. Checksums catch damage, not intent.
Whoever loads artifacts from others should give `trusted_keys`: an artifact then loads only if
one of those keys signed its manifest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from byoc.errors import ArtifactError

SIGNATURE_FILE = "manifest.sig"
PrivateKey = Ed25519PrivateKey | bytes
PublicKey = Ed25519PublicKey | bytes


def private_key(key: PrivateKey) -> Ed25519PrivateKey:
    """An Ed25519 private key from a key object, PEM bytes, or its 32 raw bytes."""
    if isinstance(key, Ed25519PrivateKey):
        return key
    if isinstance(key, bytes) and len(key) == 32:
        return Ed25519PrivateKey.from_private_bytes(key)
    loaded = serialization.load_pem_private_key(key, password=None)
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ArtifactError(f"artifacts are signed with Ed25519 keys, not {type(loaded).__name__}")
    return loaded


def public_key(key: PublicKey) -> Ed25519PublicKey:
    """An Ed25519 public key from a key object, PEM bytes, or its 32 raw bytes."""
    if isinstance(key, Ed25519PublicKey):
        return key
    if isinstance(key, bytes) and len(key) == 32:
        return Ed25519PublicKey.from_public_bytes(key)
    loaded = serialization.load_pem_public_key(key)
    if not isinstance(loaded, Ed25519PublicKey):
        raise ArtifactError(f"artifacts are verified with Ed25519 keys, not {type(loaded).__name__}")
    return loaded


def fingerprint(key: PublicKey) -> str:
    raw = public_key(key).public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(manifest: bytes, key: PrivateKey) -> bytes:
    return private_key(key).sign(manifest)


def verify(manifest: bytes, signature: bytes | None, trusted_keys: Iterable[PublicKey], where: str) -> str:
    """The fingerprint of the trusted key that signed `manifest`; ArtifactError when the
    artifact is unsigned or no trusted key signed it."""
    keys = [public_key(k) for k in trusted_keys]
    if not keys:
        raise ArtifactError(f"{where}: trusted_keys is empty; give the keys whose artifacts may load, or none to skip the check")
    if signature is None:
        raise ArtifactError(f"{where} is not signed, and trusted keys were given: it is refused")
    for key in keys:
        try:
            key.verify(signature, manifest)
        except InvalidSignature:
            continue
        return fingerprint(key)
    raise ArtifactError(f"{where}: its signature matches none of the {len(keys)} trusted key(s): it is refused")
