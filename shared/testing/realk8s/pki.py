"""Certificates for a loopback control plane, made with the openssl command: one CA that
signs the API server's serving certificate (and any other a caller asks for), and the key
pair that signs service-account tokens."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

DAYS = "2"
"""Long enough for any run; short, because nothing should keep these."""


def _openssl(directory: Path, *args: str) -> None:
    # check=True: a failed call stops the launch with openssl's stderr, not a later TLS error.
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert: Path
    key: Path


class Authority:
    """A self-signed CA in `directory` that issues leaf certificates beside itself."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.cert = directory / "ca.crt"
        self.key = directory / "ca.key"
        _openssl(directory, "genrsa", "-out", self.key.name, "2048")
        _openssl(
            directory, "req", "-x509", "-new", "-key", self.key.name, "-days", DAYS,
            "-subj", "/CN=numafit-realk8s-ca", "-out", self.cert.name,
        )  # fmt: skip

    def issue(
        self,
        name: str,
        *,
        common_name: str,
        organizations: Sequence[str] = (),
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
        ecdsa: bool = False,
    ) -> KeyPair:
        """`name`.crt/.key: a serving certificate for `dns` and `ips` (a client certificate
        when there are neither: its CN is the user, each of `organizations` a group, as
        kube-apiserver's --client-ca-file reads them); with `ecdsa`, a P-256 key (what the
        svc-scheduler chart's cert-manager Certificate asks for) instead of RSA 2048."""
        subject = "/CN=" + common_name + "".join(f"/O={o}" for o in organizations)
        key, csr, cert = f"{name}.key", f"{name}.csr", f"{name}.crt"
        if ecdsa:
            _openssl(
                self.directory, "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key
            )
        else:
            _openssl(self.directory, "genrsa", "-out", key, "2048")
        _openssl(self.directory, "req", "-new", "-key", key, "-subj", subject, "-out", csr)
        sans = [f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]
        lines = [
            "basicConstraints=CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={'serverAuth' if sans else 'clientAuth'}",
        ]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        extensions = self.directory / f"{name}.ext"
        extensions.write_text("\n".join(lines) + "\n")
        _openssl(
            self.directory, "x509", "-req", "-in", csr, "-CA", self.cert.name,
            "-CAkey", self.key.name, "-CAcreateserial", "-days", DAYS,
            "-extfile", extensions.name, "-out", cert,
        )  # fmt: skip
        return KeyPair(self.directory / cert, self.directory / key)


def signing_key(directory: Path) -> KeyPair:
    """The service-account token key pair (`cert` holds the public key)."""
    _openssl(directory, "genrsa", "-out", "sa.key", "2048")
    _openssl(directory, "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    return KeyPair(directory / "sa.pub", directory / "sa.key")
