"""Signed artifacts (issue 16, item 9): `boundgen keygen`, artifact/signing.py, and `serve --trust-key`
refusing unsigned, wrongly signed or altered artifacts (a real server process that exits 2 with the
reason), serving a correctly signed one."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from boundgen.artifact import signing
from boundgen.artifact.manifest import file_hashes
from boundgen.errors import ArtifactError, ConfigError
from tests.server.conftest import REPO, SCORE_SPEC
from tests.server.fake_engine import write_fake_artifact


def keygen(path) -> tuple:
    out = subprocess.run([sys.executable, "-m", "boundgen", "keygen", str(path)], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return path, path.with_name(path.name + ".pub")


def signed_artifact(tmp_path, name, private_key):
    artifact = write_fake_artifact(tmp_path / name, SCORE_SPEC)
    (artifact / "manifest.json").write_text(json.dumps({"name": "fscore", "files": file_hashes(artifact)}))
    if private_key is not None:
        signing.sign(artifact, signing.load_private_key(private_key))
    return artifact


def test_keygen_sign_verify(tmp_path):
    private, public = keygen(tmp_path / "key")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    artifact = signed_artifact(tmp_path, "a", private)
    assert "manifest.sig" not in file_hashes(artifact)  # the manifest's file list leaves the signature out
    signing.verify(artifact, signing.load_public_key(public))
    (artifact / "manifest.json").write_text((artifact / "manifest.json").read_text() + " ")
    with pytest.raises(ArtifactError, match="not a valid signature"):
        signing.verify(artifact, signing.load_public_key(public))
    with pytest.raises(ConfigError, match="exists"):
        signing.generate_key(private)
    junk = tmp_path / "junk.pub"
    junk.write_text("not a key")
    with pytest.raises(ConfigError, match="not a PEM public key"):
        signing.load_public_key(junk)


@pytest.fixture
def keys(tmp_path):
    return keygen(tmp_path / "key"), keygen(tmp_path / "other")


def test_serve_trust_key_serves_signed_artifact(launch, tmp_path, keys):
    (private, public), _ = keys
    server = launch([signed_artifact(tmp_path, "good", private)], args=["--trust-key", str(public)])
    assert server.stop() == 0


@pytest.mark.parametrize("case", ["unsigned", "other key", "manifest edited", "replicas, other key"])
def test_serve_trust_key_refuses(launch, tmp_path, keys, case):
    (private, public), (other, _) = keys
    artifact = signed_artifact(tmp_path, "bad", None if case == "unsigned" else other if "other" in case else private)
    if case == "manifest edited":
        (artifact / "manifest.json").write_text((artifact / "manifest.json").read_text().replace("fscore", "fscorf"))
    args = ["--trust-key", str(public)] + (["--replicas", "1"] if "replicas" in case else [])
    server = launch([artifact], args=args, wait_ready=False)
    assert server.proc.wait(60) == 2
    server._reader.join(10)
    expected = "is not signed" if case == "unsigned" else "not a valid signature"
    assert expected in server.tail(), server.tail()


def test_serve_bad_trust_key_is_a_clear_error(tmp_path):
    junk = tmp_path / "junk.pub"
    junk.write_text("not a key")
    out = subprocess.run([sys.executable, "-m", "tests.server.fake_serve", str(write_fake_artifact(tmp_path / "a", SCORE_SPEC)),
                          "--http-port", "0", "--grpc-port", "0", "--trust-key", str(junk)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "is not a PEM public key" in out.stderr and "Traceback" not in out.stderr
