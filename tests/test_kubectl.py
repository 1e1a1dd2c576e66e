"""The real kubectl against the emulator: what people type, with nothing turned off.

Each test starts the emulator in process, writes its kubeconfig, and runs the `kubectl` found on
PATH (or /usr/bin/kubectl) as a subprocess with a private HOME, so no cache or config is
shared. Validation stays on, so apply downloads the OpenAPI documents; `create` sends protobuf;
`get` asks for server-side Tables; `diff` and `--dry-run=server` send dryRun=All. What kubectl
did is checked by reading the emulator back through its API, never by trusting kubectl's output
alone. Every wait is on a subprocess or a stream, bounded by asyncio.timeout; nothing sleeps.
Skipped when no kubectl is installed (.ci/run installs Debian's kubernetes-client).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest

from shared.testing.kube_emulator import KubeEmulator

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def _find_kubectl() -> str | None:
    found = shutil.which("kubectl")
    if found is None and Path("/usr/bin/kubectl").exists():
        found = "/usr/bin/kubectl"
    return found


KUBECTL = _find_kubectl()
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

COMMAND_S = 60.0  # upper bound for one kubectl run (it starts in well under a second)

POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: main
    image: busybox
    resources:
      limits: {cpu: 100m}
"""


@dataclass(frozen=True)
class Run:
    rc: int
    out: str
    err: str


class Kubectl:
    """kubectl with the emulator's kubeconfig and a private HOME."""

    def __init__(self, kubeconfig: Path, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "KUBECONFIG": str(kubeconfig),
        }

    async def run(self, *args: str, stdin: str | None = None) -> Run:
        assert KUBECTL is not None
        process = await asyncio.create_subprocess_exec(
            KUBECTL,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        try:
            async with asyncio.timeout(COMMAND_S):
                out, err = await process.communicate(None if stdin is None else stdin.encode())
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        assert process.returncode is not None
        return Run(process.returncode, out.decode(), err.decode())

    async def ok(self, *args: str, stdin: str | None = None) -> str:
        """Run kubectl, expecting success; its stdout."""
        result = await self.run(*args, stdin=stdin)
        assert result.rc == 0, f"kubectl {' '.join(args)} failed: {result.err}"
        return result.out


class Api:
    """Reads of the emulator's state over its REST API."""

    def __init__(self, emulator: KubeEmulator, session: aiohttp.ClientSession) -> None:
        self.url = emulator.url
        self.session = session

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.url + path) as response:
            return response.status, orjson.loads(await response.read())

    async def object(self, path: str) -> Any:
        status, body = await self.get(path)
        assert status == 200, body
        return body

    async def missing(self, path: str) -> bool:
        status, _ = await self.get(path)
        return status == 404

    async def send(self, method: str, path: str, body: Any, content_type: str) -> Any:
        async with self.session.request(
            method, self.url + path, data=orjson.dumps(body), headers={"Content-Type": content_type}
        ) as response:
            answer = orjson.loads(await response.read())
            assert response.status < 300, answer
            return answer

    async def revision(self) -> str:
        """The store's revision: any write anywhere moves it."""
        listed = await self.object("/api/v1/namespaces")
        return str(listed["metadata"]["resourceVersion"])


@pytest.fixture
async def emulator() -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as running:
        yield running


@pytest.fixture
def kubectl(emulator: KubeEmulator, tmp_path: Path) -> Kubectl:
    return Kubectl(emulator.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "home")


@pytest.fixture
async def api(emulator: KubeEmulator) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(emulator, session)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "pod.yaml"
    path.write_text(POD)
    return path


def _variant(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


POD_PATH = "/api/v1/namespaces/default/pods/web"


# --- apply, validation ---------------------------------------------------------------------------


async def test_apply_validates_and_creates(
    kubectl: Kubectl, api: Api, manifest: Path, tmp_path: Path
) -> None:
    out = await kubectl.ok("apply", "-f", str(manifest))

    assert "pod/web created" in out
    pod = await api.object(POD_PATH)
    assert pod["spec"]["containers"][0]["image"] == "busybox"
    assert pod["metadata"]["labels"] == {"app": "web"}


async def test_apply_refuses_an_unknown_field(kubectl: Kubectl, api: Api, tmp_path: Path) -> None:
    typo = POD.replace("name: web", "name: typo").replace("resources:", "resourcs:")
    result = await kubectl.run("apply", "-f", str(_variant(tmp_path, "typo.yaml", typo)))

    assert result.rc != 0
    assert "unknown field" in result.err
    assert "resourcs" in result.err
    assert await api.missing("/api/v1/namespaces/default/pods/typo")


async def test_explain_reads_the_schemas(kubectl: Kubectl) -> None:
    spec = await kubectl.ok("explain", "pod.spec")
    containers = await kubectl.ok("explain", "pod.spec.containers.resources")
    topology = await kubectl.ok("explain", "noderesourcetopologies.zones")

    assert "KIND:" in spec
    assert "Pod" in spec
    for field in ("containers", "nodeName", "schedulerName", "tolerations"):
        assert field in spec
    assert "limits" in containers
    assert "requests" in containers
    assert "NodeResourceTopology" in topology
    assert "resources" in topology


# --- dry runs and diff change nothing ------------------------------------------------------------


async def _first_event(api: Api, since: str) -> Any:
    async with (
        asyncio.timeout(COMMAND_S),
        api.session.get(
            f"{api.url}/api/v1/namespaces/default/pods",
            params={"watch": "true", "resourceVersion": since},
        ) as stream,
    ):
        return orjson.loads(await stream.content.readline())


async def test_server_dry_runs_and_diff_change_nothing(
    kubectl: Kubectl, api: Api, manifest: Path, tmp_path: Path
) -> None:
    await kubectl.ok("apply", "-f", str(manifest))
    before = await api.object(POD_PATH)
    revision = await api.revision()
    first_event = asyncio.create_task(_first_event(api, revision))
    changed = _variant(tmp_path, "changed.yaml", POD.replace("busybox", "nginx"))
    other = _variant(tmp_path, "ghost.yaml", POD.replace("name: web", "name: ghost"))

    created = await kubectl.ok("apply", "-f", str(other), "--dry-run=server")
    applied = await kubectl.ok(
        "apply",
        "-f",
        str(changed),
        "--dry-run=server",
        "-o",
        "jsonpath={.spec.containers[0].image}",
    )
    patched = await kubectl.ok(
        "patch",
        "pod",
        "web",
        "--dry-run=server",
        "-p",
        '{"metadata":{"labels":{"tier":"x"}}}',
        "-o",
        "jsonpath={.metadata.labels.tier}",
    )
    deleted = await kubectl.ok("delete", "pod", "web", "--dry-run=server")
    unchanged_diff = await kubectl.run("diff", "-f", str(manifest))
    changed_diff = await kubectl.run("diff", "-f", str(changed))

    # The dry runs answered what the writes would have done...
    assert "created (server dry run)" in created
    assert applied == "nginx"
    assert patched == "x"
    assert "deleted (server dry run)" in deleted
    assert unchanged_diff.rc == 0
    assert unchanged_diff.out == ""
    assert changed_diff.rc == 1
    assert "+  - image: nginx" in changed_diff.out
    assert "-  - image: busybox" in changed_diff.out
    # ...and stored nothing: same object, same revision, no watch event before the next write.
    assert await api.object(POD_PATH) == before
    assert await api.missing("/api/v1/namespaces/default/pods/ghost")
    assert await api.revision() == revision
    assert not first_event.done()
    await kubectl.ok("label", "pod", "web", "after=dry-runs")
    event = await first_event
    assert event["type"] == "MODIFIED"
    assert event["object"]["metadata"]["labels"]["after"] == "dry-runs"


# --- generators that send protobuf ---------------------------------------------------------------


async def test_create_namespace_quota_and_configmap(kubectl: Kubectl, api: Api) -> None:
    await kubectl.ok("create", "namespace", "team-a")
    await kubectl.ok("create", "quota", "gpus", "-n", "team-a", "--hard=cpu=2,pods=3")
    await kubectl.ok("create", "configmap", "settings", "-n", "team-a", "--from-literal=a=b")

    namespace = await api.object("/api/v1/namespaces/team-a")
    quota = await api.object("/api/v1/namespaces/team-a/resourcequotas/gpus")
    config_map = await api.object("/api/v1/namespaces/team-a/configmaps/settings")
    assert namespace["status"]["phase"] == "Active"
    assert quota["spec"]["hard"] == {"cpu": "2", "pods": "3"}
    assert config_map["data"] == {"a": "b"}
    listed = await kubectl.ok("get", "namespaces")
    assert listed.split("\n")[0].split() == ["NAME", "STATUS", "AGE"]
    assert any(line.split()[:2] == ["team-a", "Active"] for line in listed.splitlines())


# --- server-side printing ------------------------------------------------------------------------


async def _placed_pod(kubectl: Kubectl, api: Api, manifest: Path) -> None:
    """web, bound to node-1 and running at 10.1.0.7, with an event about it."""
    await api.send(
        "POST",
        "/api/v1/nodes",
        {
            "metadata": {"name": "node-1", "labels": {"node-role.kubernetes.io/worker": ""}},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "nodeInfo": {"kubeletVersion": "v1.33.0"},
            },
        },
        "application/json",
    )
    await kubectl.ok("apply", "-f", str(manifest))
    await api.send(
        "POST",
        POD_PATH + "/binding",
        {"metadata": {"name": "web"}, "target": {"kind": "Node", "name": "node-1"}},
        "application/json",
    )
    await api.send(
        "PATCH",
        POD_PATH + "/status",
        {
            "status": {
                "phase": "Running",
                "podIP": "10.1.0.7",
                "containerStatuses": [
                    {
                        "name": "main",
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                    }
                ],
            }
        },
        "application/merge-patch+json",
    )
    pod = await api.object(POD_PATH)
    await api.send(
        "POST",
        "/api/v1/namespaces/default/events",
        {
            "metadata": {"name": "web.1"},
            "involvedObject": {
                "kind": "Pod",
                "name": "web",
                "namespace": "default",
                "uid": pod["metadata"]["uid"],
            },
            "reason": "Scheduled",
            "message": "Successfully assigned default/web to node-1",
            "type": "Normal",
            "source": {"component": "default-scheduler"},
            "firstTimestamp": pod["metadata"]["creationTimestamp"],
            "lastTimestamp": pod["metadata"]["creationTimestamp"],
            "count": 1,
        },
        "application/json",
    )


def _table(out: str) -> tuple[str, list[list[str]]]:
    """kubectl's printed table: the header line, and each row split on runs of 2+ spaces."""
    lines = [line for line in out.splitlines() if line.strip()]
    rows = [[cell.strip() for cell in line.split("  ") if cell.strip()] for line in lines[1:]]
    return lines[0], rows


async def test_get_prints_the_usual_columns(kubectl: Kubectl, api: Api, manifest: Path) -> None:
    await _placed_pod(kubectl, api, manifest)

    pods_header, pods = _table(await kubectl.ok("get", "pods"))
    wide_header, wide = _table(await kubectl.ok("get", "pods", "-o", "wide"))
    nodes_header, nodes = _table(await kubectl.ok("get", "nodes"))
    events_header, events = _table(await kubectl.ok("get", "events"))

    assert pods_header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert pods[0][:4] == ["web", "1/1", "Running", "0"]
    assert wide_header.split() == [
        *("NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"),
        *("NOMINATED", "NODE", "READINESS", "GATES"),
    ]
    assert wide[0][5:] == ["10.1.0.7", "node-1", "<none>", "<none>"]
    assert nodes_header.split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert nodes[0][:3] == ["node-1", "Ready", "worker"]
    assert nodes[0][4] == "v1.33.0"
    assert events_header.split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert events[0][1:] == [
        "Normal",
        "Scheduled",
        "pod/web",
        "Successfully assigned default/web to node-1",
    ]


async def test_describe_pod_shows_the_pod_and_its_events(
    kubectl: Kubectl, api: Api, manifest: Path
) -> None:
    await _placed_pod(kubectl, api, manifest)

    described = await kubectl.ok("describe", "pod", "web")

    assert "Name:" in described
    assert "web" in described
    assert "node-1" in described
    assert "busybox" in described
    assert "Successfully assigned default/web to node-1" in described


# --- writes --------------------------------------------------------------------------------------


async def test_patch_changes_the_pod(kubectl: Kubectl, api: Api, manifest: Path) -> None:
    await kubectl.ok("apply", "-f", str(manifest))
    before = await api.object(POD_PATH)

    await kubectl.ok("patch", "pod", "web", "-p", '{"metadata":{"labels":{"tier":"gpu"}}}')

    after = await api.object(POD_PATH)
    assert after["metadata"]["labels"] == {"app": "web", "tier": "gpu"}
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])


async def test_server_side_apply_twice_then_a_change(
    kubectl: Kubectl, api: Api, manifest: Path, tmp_path: Path
) -> None:
    first = await kubectl.ok("apply", "--server-side", "-f", str(manifest))
    created = await api.object(POD_PATH)
    second = await kubectl.ok("apply", "--server-side", "-f", str(manifest))
    again = await api.object(POD_PATH)
    relabelled = POD.replace("labels: {app: web}", "labels: {tier: gpu}")
    await kubectl.ok("apply", "--server-side", "-f", str(_variant(tmp_path, "t.yaml", relabelled)))
    changed = await api.object(POD_PATH)

    assert "serverside-applied" in first
    assert "serverside-applied" in second
    assert [(e["manager"], e["operation"]) for e in created["metadata"]["managedFields"]] == [
        ("kubectl", "Apply")
    ]
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    # The label the manager stopped applying is gone; the one it applies now is there.
    assert changed["metadata"]["labels"] == {"tier": "gpu"}


async def test_server_side_apply_conflicts_with_another_manager(
    kubectl: Kubectl, api: Api, manifest: Path, tmp_path: Path
) -> None:
    await kubectl.ok("apply", "--server-side", "-f", str(manifest))
    await kubectl.ok("label", "pod", "web", "app=other", "--overwrite")
    conflicting = await kubectl.run("apply", "--server-side", "-f", str(manifest))
    kept = await api.object(POD_PATH)
    await kubectl.ok("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
    forced = await api.object(POD_PATH)

    assert conflicting.rc != 0
    assert "conflict" in conflicting.err
    assert "kubectl-label" in conflicting.err
    assert kept["metadata"]["labels"]["app"] == "other"
    assert forced["metadata"]["labels"]["app"] == "web"


async def test_delete_removes_the_pod(kubectl: Kubectl, api: Api, manifest: Path) -> None:
    await kubectl.ok("apply", "-f", str(manifest))

    out = await kubectl.ok("delete", "pod", "web")

    assert 'pod "web" deleted' in out
    assert await api.missing(POD_PATH)
