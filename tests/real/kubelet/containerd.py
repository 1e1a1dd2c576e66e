"""containerd for the real kubelet: its own root, state and socket, images imported by hand.

The configuration is `containerd config default` with what this machine needs changed (see
../shared/k8s/README.md): cgroupfs (kubelet's driver here), the hand-made sandbox image,
`restrict_oom_score_adj` (root here lacks CAP_SYS_RESOURCE: without it every sandbox fails
with `can't get final child's PID from pipe: EOF`), and CNI from the Debian package with a
conflist holding only `loopback` (pods use the host network; containerd reports the runtime
network ready only when some CNI config exists).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from tests.real.kubelet import host
from tests.real.kubelet.images import SANDBOX_IMAGE, write_images
from tests.real.waiting import poll

if TYPE_CHECKING:
    from pathlib import Path

    from shared.testing.realk8s.procs import Child, Processes

NAMESPACE = "k8s.io"
"""containerd namespace of the CRI plugin: images kubelet can run must be imported there."""
CNI_BIN = "/usr/lib/cni"
"""Debian's containernetworking-plugins."""
START_WITHIN = 60.0


class ContainerdError(RuntimeError):
    pass


def missing() -> str | None:
    """Why containerd cannot run here (one line), or None."""
    for tool in ("containerd", "ctr", "runc"):
        if shutil.which(tool) is None:
            return f"real kubelet tier: {tool} not on PATH (apt-get install containerd runc)"
    if not os.access(f"{CNI_BIN}/loopback", os.X_OK):
        return f"real kubelet tier: no {CNI_BIN}/loopback (apt-get install containernetworking-plugins)"
    if not os.access("/bin/busybox", os.X_OK):
        return "real kubelet tier: no static /bin/busybox for the images (apt-get install busybox-static)"
    return None


def _set(config: str, key: str, value: str, *, after: str | None = None) -> str:
    """`key = <anything>` -> `key = value` (the first one after the line `after`, if given)."""
    start = 0
    if after is not None:
        found = config.find(after)
        if found < 0:
            raise ContainerdError(f"containerd config default has no {after}")
        start = found
    pattern = re.compile(rf"^(\s*){re.escape(key)} = .*$", re.MULTILINE)
    match = pattern.search(config, start)
    if match is None:
        raise ContainerdError(f"containerd config default has no {key}")
    return config[: match.start()] + f"{match.group(1)}{key} = {value}" + config[match.end() :]


def configuration(default: str, directory: Path) -> str:
    """`containerd config default` (text) adapted to run from `directory`."""
    config = default
    config = _set(config, "root", json.dumps(str(directory / "root")))
    config = _set(config, "state", json.dumps(str(directory / "state")))
    config = _set(config, "address", json.dumps(str(directory / "containerd.sock")), after="[grpc]")
    config = _set(config, "restrict_oom_score_adj", "true")
    config = _set(config, "sandbox_image", json.dumps(SANDBOX_IMAGE))
    config = _set(config, "SystemdCgroup", "false")
    config = _set(config, "bin_dir", json.dumps(CNI_BIN))
    config = _set(config, "conf_dir", json.dumps(str(directory / "cni")))
    return _set(
        config, "path", json.dumps(str(directory / "opt")), after='"io.containerd.internal.v1.opt"'
    )


LOOPBACK_CONFLIST = {
    "cniVersion": "0.4.0",
    "name": "numafit-loopback",
    "plugins": [{"type": "loopback"}],
}


class Containerd:
    def __init__(self, directory: Path, processes: Processes) -> None:
        self.directory = directory
        self.processes = processes
        self.socket = directory / "containerd.sock"
        self.child: Child | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", NAMESPACE, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and done.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        default = subprocess.run(
            ["containerd", "config", "default"], capture_output=True, text=True, check=True
        ).stdout
        config = self.directory / "config.toml"
        config.write_text(configuration(default, self.directory))
        cni = self.directory / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-loopback.conflist").write_text(json.dumps(LOOPBACK_CONFLIST))
        self.child = self.processes.start("containerd", ["containerd", "--config", str(config)])

        def answering() -> bool:
            if self.child is not None and not self.child.alive():
                raise ContainerdError(f"containerd exited:\n{self.child.tail()}")
            return self.ctr("version", check=False).returncode == 0

        poll(answering, within=START_WITHIN, what="containerd answering")
        images = self.directory / "images"
        images.mkdir(exist_ok=True)
        for image in write_images(images):
            self.ctr("images", "import", str(image.archive))

    def stop(self) -> None:
        """Kill every container, stop containerd and its shims, unmount and remove its
        directories."""
        if self.child is not None and self.child.alive():
            self._kill_containers()
            self.child.stop(grace=10.0)
        # Shims outlive containerd by design; these name our socket, so they are ours.
        for pid in host.processes_with_argument(str(self.socket)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        self._wait_shims_gone()
        for part in ("state", "root"):
            host.remove_tree(self.directory / part)

    def _kill_containers(self) -> None:
        tasks = self.ctr("tasks", "list", "--quiet", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        for task in tasks:
            self.ctr("tasks", "delete", "--force", task, check=False)
        for container in self.ctr("containers", "list", "--quiet", check=False).stdout.split():
            self.ctr("containers", "delete", container, check=False)

    def _wait_shims_gone(self) -> None:
        deadline = time.monotonic() + 10.0
        while host.processes_with_argument(str(self.socket)) and time.monotonic() < deadline:
            time.sleep(0.1)  # SIGKILLed processes are reaped by init; bounded
