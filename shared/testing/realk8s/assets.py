"""Where the binaries of a real control plane are, or why they are not (one line).

envtest's convention: `KUBEBUILDER_ASSETS` names a folder holding kube-apiserver,
kube-controller-manager and kube-scheduler (and etcd, else etcd on PATH). Certificates are
made with the openssl command, so it must be on PATH too.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
VARIABLE = "KUBEBUILDER_ASSETS"


@dataclass(frozen=True, slots=True)
class Assets:
    directory: Path
    etcd: Path

    def binary(self, name: str) -> Path:
        return self.directory / name


def find(environ: Mapping[str, str] | None = None) -> Assets | str:
    """The assets, or why a real control plane cannot run here."""
    env = os.environ if environ is None else environ
    named = env.get(VARIABLE, "")
    if not named:
        return f"{VARIABLE} not set (no real control plane binaries)"
    directory = Path(named).resolve()
    missing = [b for b in BINARIES if not os.access(directory / b, os.X_OK)]
    if missing:
        return f"{VARIABLE}={named} lacks {', '.join(missing)}"
    etcd = directory / "etcd"
    if not os.access(etcd, os.X_OK):
        found = shutil.which("etcd")
        if found is None:
            return f"no etcd in {VARIABLE}={named} nor on PATH"
        etcd = Path(found)
    if shutil.which("openssl") is None:
        return "openssl not on PATH (it makes the control plane's certificates)"
    return Assets(directory, etcd)
