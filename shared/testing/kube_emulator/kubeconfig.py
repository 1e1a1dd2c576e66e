"""A kubeconfig pointing at the emulator, loadable unchanged by kubernetes_asyncio and kubectl.

Plain http with a bearer token that nobody checks: enough for `config.load_kube_config` to build
a working client, and nothing that looks like a credential worth protecting.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

CONTEXT = "kube-emulator"


def render(server_url: str, namespace: str = "default") -> str:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server_url}}],
        "users": [{"name": CONTEXT, "user": {"token": "kube-emulator"}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }
    return yaml.safe_dump(document, sort_keys=False)


def write(path: str | os.PathLike[str], server_url: str) -> Path:
    """Write atomically, so whoever waits for the file never reads half of it."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(render(server_url))
        # Readable by the other (non-root) services sharing the file; it holds no secret.
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise
    return target
