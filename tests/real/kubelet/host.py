"""What kubelet and containerd leave on the host outside their own processes, and removing it.

kubelet writes outside any directory a test can give it: `/var/lib/kubelet` (the registration
socket is always `/var/lib/kubelet/device-plugins/kubelet.sock`), `/var/log/pods`,
`/var/log/containers` and the `kubepods` cgroups in every controller; containerd leaves
overlay and shm mounts under its root and state. Every fixture here removes them at teardown,
a failed test included, and before it starts (a run killed before its teardown).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

KUBELET_ROOT = Path("/var/lib/kubelet")
DEVICE_PLUGIN_DIR = KUBELET_ROOT / "device-plugins"
POD_LOGS = Path("/var/log/pods")
CONTAINER_LOGS = Path("/var/log/containers")
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
MARKER = ".numafit-real-tier"
"""Written into /var/lib/kubelet when the tier creates it: a directory without it belongs to
someone else and is never touched."""


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return (
        field.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def mounts_under(prefix: Path) -> list[Path]:
    """Mount points at or below `prefix` in this mount namespace, deepest first."""
    base = str(prefix).rstrip("/")
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = _unescape(line.split()[4])
        if point == base or point.startswith(base + "/"):
            found.append(Path(point))
    return sorted(found, key=lambda p: (len(p.parts), str(p)), reverse=True)


def unmount_under(prefix: Path) -> None:
    """Unmount everything at or below `prefix`; a busy mount is detached lazily."""
    for point in mounts_under(prefix):
        done = subprocess.run(["umount", str(point)], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def remove_tree(path: Path) -> None:
    """`rm -rf path` after unmounting whatever is mounted inside it."""
    if not path.exists() and not path.is_symlink():
        return
    unmount_under(path)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True, check=False)


def _cgroup_dirs(name: str) -> list[Path]:
    """`name` in every mounted cgroup hierarchy (v1: one per controller)."""
    if not CGROUP_ROOT.is_dir():
        return []
    return [c / name for c in CGROUP_ROOT.iterdir() if (c / name).is_dir()]


def remove_cgroups(name: str = KUBEPODS) -> list[str]:
    """Remove the `name` cgroup tree in every hierarchy, leaves first. A process still in one
    is a container of the tier's (kubelet made these cgroups): it is killed first. Returns
    what could not be removed."""
    left = []
    for top in _cgroup_dirs(name):
        groups = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts))
        for group in [*reversed(groups), top]:
            procs = group / "cgroup.procs"
            with contextlib.suppress(OSError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            try:
                group.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(str(group))
    return left


def processes_with_argument(argument: str) -> list[int]:
    """Processes whose command line holds `argument` as one of its words (containerd's shims
    name the containerd socket that started them with `-address`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.fsencode(argument) in words:
            pids.append(int(entry.name))
    return pids


def kubelet_root_foreign() -> str | None:
    """Why /var/lib/kubelet must not be touched (it exists and is not the tier's), or None."""
    if KUBELET_ROOT.exists() and not (KUBELET_ROOT / MARKER).exists():
        return f"{KUBELET_ROOT} exists and was not made by the real tier: not touching it"
    return None


def clean_kubelet_leftovers() -> None:
    """Everything kubelet leaves outside its processes (see the module's docstring)."""
    remove_tree(KUBELET_ROOT)
    remove_tree(POD_LOGS)
    remove_tree(CONTAINER_LOGS)
    remove_cgroups()


def leftovers(containerd_socket: Path) -> list[str]:
    """What is still on the host after a teardown (nothing, when it worked)."""
    found = [str(p) for p in (KUBELET_ROOT, POD_LOGS, CONTAINER_LOGS) if p.exists()]
    found += [str(d) for d in _cgroup_dirs(KUBEPODS)]
    found += [f"mount {m}" for m in mounts_under(KUBELET_ROOT)]
    found += [f"shim pid {p}" for p in processes_with_argument(str(containerd_socket))]
    return found
