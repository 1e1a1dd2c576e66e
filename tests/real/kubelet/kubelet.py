"""A real kubelet (upstream v1.28.7) on containerd, seeing two NUMA nodes.

It runs inside its own mount namespace (`unshare -m`) where, after `mount --make-rprivate
/sys` (so nothing mounted there reaches the host), the fake tree of `sysfs.py` covers
`/sys/devices/system/node`. /var/lib/kubelet is bind-mounted onto itself and made shared
first, so what kubelet mounts for pods there reaches containerd, which runs in the host's
namespace.

Settings are ../shared/k8s/README.md's: the static CPU manager with cpu0 reserved, the
Topology Manager at container scope with the policy a test asks for, cgroupfs, no swap check,
everything on 127.0.0.1 and no read-only port.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from typing import TYPE_CHECKING, Any

import yaml

from tests.real.controlplane import free_port
from tests.real.kubelet import host
from tests.real.kubelet.sysfs import write_numa_tree
from tests.real.waiting import poll

if TYPE_CHECKING:
    from pathlib import Path

    from shared.testing.realk8s.procs import Child, Processes

SINGLE_NUMA_NODE = "single-numa-node"
BEST_EFFORT = "best-effort"
START_WITHIN = 90.0
RESERVED_CPUS = (0,)
"""kubelet's reservedSystemCPUs: cpu0 (NUMA 0) is the system's, cpu1 (NUMA 1) the only
exclusive CPU."""


class KubeletError(RuntimeError):
    pass


def kubelet_configuration(
    policy: str, containerd_endpoint: str, port: int, healthz_port: int
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": containerd_endpoint,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "cpuManagerPolicy": "static",
        # How often the CPU manager drops the assignments of pods that are gone (10 s by
        # default); after a restart that is what frees a deleted pod's exclusive CPU.
        "cpuManagerReconcilePeriod": "2s",
        "reservedSystemCPUs": ",".join(str(cpu) for cpu in RESERVED_CPUS),
        "topologyManagerPolicy": policy,
        "topologyManagerScope": "container",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        # The tests' pods are tiny; a busy CI disk must not make kubelet evict them.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # Status reaches the API server within a second or two of a change.
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "2s",
        "fileCheckFrequency": "20s",
        "registerNode": True,
        "serializeImagePulls": False,
        "staticPodPath": "",
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
    }


class Kubelet:
    """One kubelet process; `restart` keeps its state directory (its checkpoints)."""

    def __init__(
        self,
        binary: Path,
        directory: Path,
        processes: Processes,
        *,
        node: str,
        kubeconfig: Path,
        containerd_endpoint: str,
    ) -> None:
        self.binary = binary
        self.directory = directory
        self.processes = processes
        self.node = node
        self.kubeconfig = kubeconfig
        self.containerd_endpoint = containerd_endpoint
        self.numa_tree = write_numa_tree(directory / "numa")
        self.policy: str | None = None
        self.child: Child | None = None
        self.starts = 0
        self.started = 0.0
        """When the running kubelet was started (wall clock, as file times are)."""

    @property
    def alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def prepare_root(self) -> None:
        """/var/lib/kubelet created (with the tier's marker), bound onto itself and shared."""
        host.KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
        (host.KUBELET_ROOT / host.MARKER).write_text("made by tests/real/kubelet\n")
        if not host.mounts_under(host.KUBELET_ROOT):
            _run("mount", "--bind", str(host.KUBELET_ROOT), str(host.KUBELET_ROOT))
        _run("mount", "--make-shared", str(host.KUBELET_ROOT))

    def start(self, policy: str) -> None:
        if self.alive:
            raise KubeletError("kubelet already running")
        self.policy = policy
        self.started = time.time()
        port, healthz = free_port(), free_port()
        config = self.directory / f"kubelet-{policy}.yaml"
        config.write_text(
            yaml.safe_dump(kubelet_configuration(policy, self.containerd_endpoint, port, healthz))
        )
        argv = [
            str(self.binary),
            f"--config={config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={host.KUBELET_ROOT}",
            f"--cert-dir={self.directory / 'pki'}",
            f"--hostname-override={self.node}",
            "--v=2",
        ]
        # $0 is the fake tree; "$@" is kubelet's command line (exec keeps the PID).
        script = (
            'mount --make-rprivate /sys && mount --bind "$0" /sys/devices/system/node && exec "$@"'
        )
        self.starts += 1
        self.child = self.processes.start(
            f"kubelet-{self.starts}",
            [
                "unshare",
                "--mount",
                "--propagation",
                "unchanged",
                "--",
                "/bin/sh",
                "-c",
                script,
                str(self.numa_tree),
                *argv,
            ],
        )

        def healthy() -> bool:
            if self.child is not None and not self.child.alive():
                raise KubeletError(f"kubelet exited:\n{self.child.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{healthz}/healthz", timeout=2):
                    return True
            except OSError:  # refused while starting, or an HTTP error status
                return False

        poll(healthy, within=START_WITHIN, what="kubelet healthz")

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(grace=20.0)
            self.child = None

    def restart(self, policy: str | None = None) -> None:
        """Stop and start again (with `policy`, or the same one); pods keep running."""
        self.stop()
        self.start(policy or self.policy or SINGLE_NUMA_NODE)

    def cpu_assignments(self) -> dict[str, dict[str, str]]:
        """The CPU manager's checkpoint: pod UID -> container -> its exclusive CPUs."""
        try:
            state = json.loads((host.KUBELET_ROOT / "cpu_manager_state").read_text())
        except (OSError, ValueError):
            return {}
        entries: dict[str, dict[str, str]] = state.get("entries") or {}
        return entries

    def healthy_devices(self, resource: str) -> int | None:
        """How many healthy devices of `resource` this kubelet has recorded since it started:
        its device manager rewrites its checkpoint whenever a plugin's device list changes.
        None while the checkpoint is still the previous kubelet's (or absent): a restarted
        kubelet admits nothing of `resource` until its plugin registered again, while the
        Node still shows what the previous kubelet reported."""
        path = host.DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint"
        try:
            if path.stat().st_mtime < self.started:
                return None
            registered = json.loads(path.read_text())["Data"]["RegisteredDevices"] or {}
        except (OSError, ValueError, KeyError):
            return None
        return len(registered.get(resource) or [])

    def log(self) -> str:
        return "" if self.child is None else self.child.tail(200)


def _run(*argv: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KubeletError(f"{' '.join(argv)}: {done.stderr.strip()}")
