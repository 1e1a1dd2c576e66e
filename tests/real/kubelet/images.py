"""Container images written by hand: no registry can be reached here, so the two images the
kubelet tier needs are docker-save tarballs built from the static busybox and imported into
containerd with `ctr images import`.

A docker-save archive is a tar holding one layer tar, the image config (JSON, named by its
sha256) and `manifest.json` tying them to a tag. One layer serves both images: busybox and a
link per applet, so `sh`, `sleep`, `cat`, `env` resolve in any command.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

BUSYBOX = "/bin/busybox"
"""Debian's busybox-static: one statically linked binary, so the layer needs no libc."""

SANDBOX_IMAGE = "numafit.local/sandbox:1"
"""containerd's sandbox_image (the pod's "pause" container)."""
WORKLOAD_IMAGE = "numafit.local/workload:1"
"""What every test container runs (pods name it with imagePullPolicy Never)."""

SANDBOX_COMMAND = ("/bin/sh", "-c", "trap 'exit 0' TERM INT; sleep 2147483647 & wait")
"""PID 1 of a pod sandbox must live until it is stopped and then exit at once: the trap ends
the shell on TERM (PID 1 ignores signals it has no handler for), and `wait` is interruptible
where a foreground `sleep` would delay the trap until it returned."""


@dataclass(frozen=True, slots=True)
class Image:
    tag: str
    archive: Path


def applets() -> list[str]:
    """Every applet the installed busybox provides (`busybox --list`)."""
    listed = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True)
    return [name for name in listed.stdout.split() if name and name != "busybox"]


def _layer() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for directory in ("bin", "etc", "tmp", "proc", "sys", "dev", "usr", "usr/local"):
            info = tarfile.TarInfo(directory)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if directory == "tmp" else 0o755
            layer.addfile(info)
        layer.add(BUSYBOX, arcname="bin/busybox")
        for name in applets():
            link = tarfile.TarInfo(f"bin/{name}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            layer.addfile(link)
    return buffer.getvalue()


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(data))


def write_image(path: Path, tag: str, command: Sequence[str], layer: bytes) -> Image:
    """A docker-save archive at `path`: `layer` as the only layer, `command` as its Cmd."""
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": list(command), "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
        },
        sort_keys=True,
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [tag], "Layers": [f"{layer_digest}/layer.tar"]}]
    ).encode()
    with tarfile.open(path, "w") as archive:
        _add(archive, f"{layer_digest}/layer.tar", layer)
        _add(archive, config_name, config)
        _add(archive, "manifest.json", manifest)
    return Image(tag, path)


def write_images(directory: Path) -> list[Image]:
    """The sandbox and workload images, as archives in `directory`."""
    layer = _layer()
    return [
        write_image(directory / "sandbox.tar", SANDBOX_IMAGE, SANDBOX_COMMAND, layer),
        write_image(directory / "workload.tar", WORKLOAD_IMAGE, ("/bin/sh",), layer),
    ]
