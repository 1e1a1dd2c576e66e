"""Certificates and keys for a loopback control plane, made with the openssl command.

One CA signs everything: kube-apiserver's serving certificate, the webhook's and extender's
serving certificate, and client certificates (CN is the user, O the groups, as kube-apiserver's
--client-ca-file reads them). The service-account key pair signs and checks tokens.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

DAYS = "2"
"""Certificates outlive any test session; short, because nothing should keep them."""


def _openssl(*args: str, cwd: Path) -> None:
    # check=True: a failed openssl call stops the fixture with its stderr, not a later TLS error.
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert: Path
    key: Path


class Authority:
    """A self-signed CA in `directory` (ca.crt, ca.key) that issues leaf certificates there."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.cert = directory / "ca.crt"
        self.key = directory / "ca.key"
        _openssl("genrsa", "-out", self.key.name, "2048", cwd=directory)
        _openssl(
            "req", "-x509", "-new", "-key", self.key.name, "-subj", "/CN=numafit-real-tier-ca",
            "-days", DAYS, "-out", self.cert.name, cwd=directory,
        )  # fmt: skip

    def issue(
        self,
        name: str,
        *,
        common_name: str,
        organizations: Sequence[str] = (),
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
    ) -> KeyPair:
        """A leaf certificate `name`.crt/.key; with `dns`/`ips` a server certificate (SANs),
        without them a client certificate."""
        subject = "/CN=" + common_name + "".join(f"/O={o}" for o in organizations)
        key, csr, cert = f"{name}.key", f"{name}.csr", f"{name}.crt"
        _openssl("genrsa", "-out", key, "2048", cwd=self.directory)
        _openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr, cwd=self.directory)
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        usage = "serverAuth" if sans else "clientAuth"
        lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
        ]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        extensions = self.directory / f"{name}.ext"
        extensions.write_text("\n".join(lines) + "\n")
        _openssl(
            "x509", "-req", "-in", csr, "-CA", self.cert.name, "-CAkey", self.key.name,
            "-CAcreateserial", "-days", DAYS, "-extfile", extensions.name, "-out", cert,
            cwd=self.directory,
        )  # fmt: skip
        return KeyPair(self.directory / cert, self.directory / key)


def signing_key(directory: Path) -> KeyPair:
    """The service-account token key pair: `cert` is the public key (sa.pub), `key` the private."""
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    return KeyPair(directory / "sa.pub", directory / "sa.key")
