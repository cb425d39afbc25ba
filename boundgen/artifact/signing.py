"""Optional Ed25519 signatures of artifacts: `boundgen build --sign-key K`, `boundgen serve --trust-key K`.

manifest.json already records the sha256 of every other file of the artifact and its own hash,
so signing its exact bytes signs the whole artifact: the signature goes beside it, in
`manifest.sig` (the base64 of the 64-byte Ed25519 signature, one line), which the manifest's
file list leaves out. A server given a trust key verifies the signature before it reads
anything else of the artifact (then the loader checks every file against the manifest's hashes)
and refuses an artifact that is unsigned, signed by another key, or whose manifest changed.

Keys are PEM files: private PKCS#8, public SubjectPublicKeyInfo, as
`boundgen keygen OUT` (OUT and OUT.pub) or `openssl genpkey -algorithm ed25519 -out OUT` and
`openssl pkey -in OUT -pubout -out OUT.pub` write them. A private key file is written 0600.
Pure functions over paths; no torch. `cryptography` is imported here only.
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from boundgen.artifact.manifest import MANIFEST_FILE, SIGNATURE_FILE
from boundgen.errors import ArtifactError, ConfigError


def generate_key(out: str | Path) -> tuple[Path, Path]:
    """Write a new private key to `out` (0600) and its public key to `out`.pub; both paths."""
    if not str(out).strip():  # Path("") is ".": "'.' exists" named no file the user gave
        raise ConfigError("the key's path is empty; name the file to write the private key to")
    private_path, public_path = Path(out), Path(f"{out}.pub")
    for path in (private_path, public_path):
        if path.exists():
            raise ConfigError(f"{path} exists; refusing to overwrite a key (give a new path)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public_path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    return private_path, public_path


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    key = _load(path, "private", lambda data: serialization.load_pem_private_key(data, password=None))
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"signing key {path} is a {type(key).__name__}, not an Ed25519 private key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    key = _load(path, "public", serialization.load_pem_public_key)
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"trust key {path} is a {type(key).__name__}, not an Ed25519 public key")
    return key


def sign(artifact_dir: str | Path, key: Ed25519PrivateKey) -> Path:
    """Sign the artifact's manifest.json as it is on disk; write and return manifest.sig."""
    manifest = Path(artifact_dir) / MANIFEST_FILE
    if not manifest.is_file():
        raise ArtifactError(f"{artifact_dir} has no {MANIFEST_FILE} to sign")
    signature = key.sign(manifest.read_bytes())
    path = Path(artifact_dir) / SIGNATURE_FILE
    path.write_text(base64.b64encode(signature).decode() + "\n")
    return path


def verify(artifact_dir: str | Path, key: Ed25519PublicKey) -> None:
    """Raise ArtifactError unless manifest.sig is `key`'s signature of manifest.json's exact bytes."""
    root = Path(artifact_dir)
    manifest, sig_path = root / MANIFEST_FILE, root / SIGNATURE_FILE
    if not manifest.is_file():
        raise ArtifactError(f"{root} has no {MANIFEST_FILE}; it is not a boundgen artifact")
    if not sig_path.is_file():
        raise ArtifactError(f"artifact {root} is not signed (no {SIGNATURE_FILE}) and a trust key was given: "
                            "build it with `boundgen build --sign-key KEY`")
    try:
        signature = base64.b64decode(sig_path.read_text().strip(), validate=True)
        key.verify(signature, manifest.read_bytes())
    except (binascii.Error, ValueError, InvalidSignature):
        raise ArtifactError(f"artifact {root}: {SIGNATURE_FILE} is not a valid signature of its {MANIFEST_FILE} by "
                            "the trust key (signed by another key, or the manifest changed after signing)") from None


def _load(path, kind: str, parse):
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{kind} key file {path} does not exist")
    try:
        return parse(path.read_bytes())
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"{path} is not a PEM {kind} key ({exc}); make keys with `boundgen keygen OUT`") from None
