"""Self-signed certificates for TLS tests (made with the openssl command line, as an operator
would)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(directory: Path, name: str = "server") -> tuple[str, str]:
    """A fresh RSA key and a self-signed certificate for localhost / 127.0.0.1 in
    ``directory``: returns (certificate path, key path)."""
    key, crt = Path(directory) / f"{name}.key", Path(directory) / f"{name}.crt"
    res = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(crt), "-days", "2", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"openssl failed: {res.stderr}"
    return str(crt), str(key)
