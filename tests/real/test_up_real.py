"""`numafit up --control-plane real` as a user runs it: a process that starts etcd,
kube-apiserver, kube-controller-manager and kube-scheduler with numafit's extender, announces
itself, serves kubectl through the kubeconfig it wrote, and leaves no process behind on Ctrl-C.

The scenario's pod and one created with kubectl afterwards carry no schedulerName: the real
MutatingWebhookConfiguration gives them numafit's; kube-scheduler (no numafit scheduling loop
runs on this control plane) binds them through the extender, whose annotations they carry, and
the node's kubelet emulator runs them."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.real.tier import real_tier
from tests.real.waiting import poll

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = real_tier()

ROOT = Path(__file__).resolve().parents[2]
NUMAFIT = str(Path(sys.executable).with_name("numafit"))
KUBECTL = "/usr/bin/kubectl"
SCENARIO = ROOT / "examples" / "single-numa-node-mismatch.yaml"
"""One node, GPU-a on NUMA 0 and GPU-b on NUMA 1; pod demo/aligned is refitted onto GPU-a."""
POD = ROOT / "examples" / "pods" / "refit-best-effort.yaml"
UP_WITHIN = 120.0
"""Seconds the whole start may take (about 8 s here)."""
ALLOCATED = "hami.io/vgpu-devices-allocated"
BIND_PHASE = "hami.io/bind-phase"


def _descendants(root: int) -> set[int]:
    """Every live process below `root` (children of children included), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in parents.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def _running(read: Callable[[], dict[str, Any]], what: str) -> dict[str, Any]:
    """The pod `read` returns, once its phase is Running."""

    def running() -> dict[str, Any] | None:
        got = read()
        return got if got.get("status", {}).get("phase") == "Running" else None

    return poll(running, within=60, what=f"{what} running", last=lambda: read().get("status"))


def test_up_on_the_real_control_plane(tmp_path: Path) -> None:
    state = tmp_path / "state"
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        up = subprocess.Popen(
            [
                NUMAFIT, "up", "--control-plane", "real", "--scenario", str(SCENARIO),
                "--state-dir", str(state), "--api-port", "0", "--nats-port", "0",
                "--extender-port", "0", "--metrics-port-base", "0",
            ],
            stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    children: set[int] = set()
    try:

        def announced() -> bool:
            if up.poll() is not None:
                raise AssertionError(f"numafit up exited {up.returncode}:\n{err.read_text()}")
            return "numafit is up in" in out.read_text()

        poll(announced, within=UP_WITHIN, what="numafit up announced", last=err.read_text)
        children = _descendants(up.pid)
        names = {Path(_command(p)).name for p in children}
        assert {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} <= names
        info = json.loads((state / "stack.json").read_text())
        assert info["controlPlane"] == "real"
        kubeconfig = info["kubeconfig"]
        assert f"export KUBECONFIG={kubeconfig}" in out.read_text()

        def kubectl(*args: str) -> str:
            done = subprocess.run(
                [KUBECTL, f"--kubeconfig={kubeconfig}", *args],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
            return done.stdout

        def pod(namespace: str, name: str) -> dict[str, Any]:
            found: dict[str, Any] = json.loads(
                kubectl("get", "pod", "-n", namespace, name, "-o", "json")
            )
            return found

        kubectl("apply", "-n", "default", "-f", str(POD))
        for namespace, name, gpu in (
            ("demo", "aligned", "GPU-a"),
            ("default", "refit-best-effort", ""),
        ):
            ran = _running(functools.partial(pod, namespace, name), f"{namespace}/{name}")
            assert ran["spec"]["schedulerName"] == "numafit-scheduler"  # the real webhook
            assert ran["spec"]["nodeName"] == "node-1"
            annotations = ran["metadata"]["annotations"]
            assert annotations[BIND_PHASE] == "success"
            assert gpu in annotations[ALLOCATED]
            events = json.loads(
                kubectl(
                    "get",
                    "events",
                    "-n",
                    namespace,
                    "-o",
                    "json",
                    f"--field-selector=involvedObject.name={name}",
                )
            )["items"]
            scheduled = [e for e in events if e["reason"] == "Scheduled"]
            assert scheduled, events
            # kube-scheduler's own Event: its reporter is the profile, its wording upstream's.
            assert scheduled[0]["reportingComponent"] == "numafit-scheduler"
            assert "Successfully assigned" in scheduled[0]["message"]
        # A deletion completes: the node agent confirms it as kubelet would.
        kubectl("delete", "pod", "-n", "default", "refit-best-effort", "--timeout=30s")
    finally:
        if up.poll() is None:
            os.kill(up.pid, signal.SIGINT)  # Ctrl-C
        try:
            code = up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
            raise
    assert code == 0, err.read_text()
    assert "numafit is down" in err.read_text()

    def survivors() -> list[str]:
        return [f"{p} {_command(p)}" for p in children if _alive(p)]

    poll(lambda: not survivors(), within=30, what="every child stopped", last=survivors)
