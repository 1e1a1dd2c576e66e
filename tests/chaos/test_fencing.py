"""Fencing of accounting's single writer, with real processes: a write whose answer did not come
never loses its claim, a replica joining or a paused owner never carries out a request that was
answered already, and every request gets at most one answer.

How the tests see it, without trusting the code under test:
- each raw request is published with a reply subject of its own, so the test counts the
  answers every request got (two answers mean two replicas acted on it);
- what landed is read from the pods' annotations through the API, and GPU usage is summed
  here from `hami.io/vgpu-devices-allocated`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import orjson

from shared import subjects
from shared.core import keys
from shared.core.partitions import targets
from shared.service import natsconn
from shared.testing.kube_emulator import KubeEmulator
from tests.builders import container, gpu, node, pod
from tests.chaos.support import (
    create,
    entry_devices,
    kube_for,
    list_pods,
    refit_body,
    reserved_pod,
    service,
    stop_all,
)
from tests.integration.harness import wait_for

if TYPE_CHECKING:
    from pathlib import Path

    from nats.aio.client import Client
    from nats.aio.msg import Msg

    from shared.service.kube_io import Kube
    from tests.chaos.support import ServiceProcess

GPU_B_MEM = 40000
POD_MEM = 12000
LEASE_TTL = "3"


def gpu_b_memory(pods: list[dict[str, Any]]) -> int:
    """MiB the annotations put on GPU-b (summed here, from the allocated annotation)."""
    total = 0
    for obj in pods:
        allocated = (obj["metadata"].get("annotations") or {}).get(keys.ALLOCATED, "")
        for entry in entry_devices(allocated):
            total += sum(mem for uuid, mem, _ in entry if uuid == "GPU-b")
    return total


def on_gpu(obj: dict[str, Any]) -> str:
    allocated = (obj["metadata"].get("annotations") or {}).get(keys.ALLOCATED, "")
    return entry_devices(allocated)[0][0][0]


async def refit(nc: Client, target: dict[str, Any], wait: float = 5.0) -> dict[str, Any]:
    body = refit_body(target, ["GPU-b"], timeoutMs=2000)
    msg = await natsconn.request(nc, subjects.refit("node-1"), orjson.dumps(body), wait)
    reply: dict[str, Any] = orjson.loads(msg.data)
    return reply


class Answers:
    """Raw accounting requests, each on a reply subject of its own: every answer is counted."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.got: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.sent: dict[str, str] = {}
        """Reply subject -> the pod the request was for."""

    async def open(self) -> None:
        await self.nc.subscribe("fencing.>", cb=self._on_answer)
        await self.nc.flush()

    async def _on_answer(self, msg: Msg) -> None:
        self.got[msg.subject].append(orjson.loads(msg.data))

    async def send(self, op: str, body: dict[str, Any], about: str) -> None:
        inbox = f"fencing.{len(self.sent)}"
        self.sent[inbox] = about
        await self.nc.publish(
            subjects.accounting(op, body["node"]), orjson.dumps(body), reply=inbox
        )

    def twice(self) -> dict[str, list[dict[str, Any]]]:
        return {inbox: got for inbox, got in self.got.items() if len(got) > 1}

    def unanswered(self) -> list[str]:
        return [inbox for inbox in self.sent if not self.got.get(inbox)]


def move_body(meta: dict[str, Any], uuid: str, mem: int) -> dict[str, Any]:
    """A raw `move` of container 0 to `uuid`, on the pod as created (its resourceVersion)."""
    entry = f"{uuid},NVIDIA,{mem},10:;"
    return {
        "podUID": meta["uid"],
        "revision": 0,
        "podResourceVersion": meta["resourceVersion"],
        "containerIndex": 0,
        "toAllocate": entry,
        "allocated": entry,
        "node": "node-1",
        "deadlineMs": 1500,
    }


async def _true() -> bool:
    return True


def replica(
    name: str, nats_url: str, kubeconfig: Path, tmp_path: Path, bucket: str
) -> ServiceProcess:
    log_dir = tmp_path / name  # a log file of its own
    log_dir.mkdir(exist_ok=True)
    return service(
        "accounting",
        nats_url,
        kubeconfig,
        log_dir,
        "--replica-id",
        name,
        "--lease-bucket",
        bucket,
        "--partitions",
        "1",
        "--lease-ttl",
        LEASE_TTL,
    )


def names_where_second_wants_the_partition() -> tuple[str, str]:
    """Two replica names: `a` sorts first, and `b` is the one the rendezvous gives partition 0
    once both live (so `a` hands it over when `b` joins)."""
    for i in range(100):
        a, b = f"acc-a{i}", f"acc-b{i}"
        if 0 in targets(b, 1, {a, b}):
            return a, b
    raise AssertionError("no pair of names found")


def names_where_first_wants_the_partition() -> tuple[str, str]:
    for i in range(100):
        a, b = f"acc-a{i}", f"acc-b{i}"
        if 0 in targets(a, 1, {a, b}):
            return a, b
    raise AssertionError("no pair of names found")


async def owns(proc: ServiceProcess) -> bool:
    try:
        text = await proc.metrics()
    except (AssertionError, OSError):
        return False
    return "numafit_accounting_partitions_owned 1.0" in text


async def seed(kube: Kube, *, holds: int, movers: int) -> tuple[list[dict[str, Any]], list[str]]:
    """node-1 with GPU-a (80000 MiB) and GPU-b (40000 MiB); `movers` pods reserved on GPU-a
    (bound, not allocated: a refit may move them), and `holds` unbound pods to hold GPU-b."""
    await create(
        kube, "node", node("node-1", [gpu("GPU-a", 0, mem=80000), gpu("GPU-b", 1, mem=GPU_B_MEM)])
    )
    created = [
        await create(kube, "pod", reserved_pod(f"mover-{i}", "GPU-a", POD_MEM, 10))
        for i in range(movers)
    ]
    unbound = [
        await create(
            kube,
            "pod",
            pod(
                f"held-{i}",
                containers=[container("main", 1, POD_MEM, 10)],
                namespace="ml",
                node_name="",
            ),
        )
        for i in range(holds)
    ]
    return created, [p["metadata"]["uid"] for p in unbound]


async def test_a_write_whose_answer_did_not_come_keeps_its_claim_until_settled(
    nats_url: str, tmp_path: Path
) -> None:
    """The issue's case: X's PATCH is held 5 s by the API server (and committed after its
    client gave up); X's refit to GPU-b is not answered in time; Y, Z and W then move to GPU-b.
    Before the fix X's write landed afterwards: 48000/40000 MiB on GPU-b."""
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        kube = await kube_for(kubeconfig)
        accounting = service("accounting", nats_url, kubeconfig, tmp_path, "--partitions", "0")
        refit_service = service("refit", nats_url, kubeconfig, tmp_path)
        connection = await natsconn.connect(nats_url, "chaos-fencing")
        nc = connection.client
        try:
            movers, _ = await seed(kube, holds=0, movers=4)
            x, *others = movers
            emulator.faults.add(
                method="PATCH",
                path_regex=r"/namespaces/ml/pods/mover-0$",
                delay_s=5.0,
                times=1,
                outlive_client=True,
            )
            accounting.start()
            refit_service.start()
            await accounting.wait_ready()
            await refit_service.wait_ready()
            first = await refit(nc, x)
            assert not first["succeeded"], first
            replies = [await refit(nc, other) for other in others]
            await wait_for(lambda: emulator.faults.in_flight == 0, within=15)
            current = await list_pods(kube)
        finally:
            await connection.close()
            stop_all([refit_service, accounting])
            await kube.api.close()
    context = f"x: {first}; others: {replies}\n{accounting.tail()}"
    assert gpu_b_memory(current) <= GPU_B_MEM, context
    by_name = {p["metadata"]["name"]: p for p in current}
    # X was told its move failed: it must not have landed, then or later.
    assert on_gpu(by_name["mover-0"]) == "GPU-a", context
    for other, reply in zip(others, replies, strict=True):
        where = on_gpu(by_name[other["metadata"]["name"]])
        assert where == ("GPU-b" if reply["succeeded"] else "GPU-a"), context
    # With X's claim settled (fenced), the three others fit GPU-b exactly.
    assert [r["code"] for r in replies] == ["moved", "moved", "moved"], context


async def test_a_joining_replica_answers_nothing_the_owner_answered(
    nats_url: str, tmp_path: Path
) -> None:
    """Replica A owns the node and holds three reservations filling GPU-b; moves to GPU-b
    stream in (A refuses them: no room) while B joins and takes the partition over. Before the
    fix B kept the moves that arrived while it was joining and carried them out once it served
    (A's unwritten holds are gone at a handover, so GPU-b looked free): answered twice, the
    second time `ok`, and the pods on the GPU that refused them."""
    first, second = names_where_second_wants_the_partition()
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        kube = await kube_for(kubeconfig)
        bucket = f"fencing-join-{tmp_path.name[-30:]}"
        a = replica(first, nats_url, kubeconfig, tmp_path, bucket)
        b = replica(second, nats_url, kubeconfig, tmp_path, bucket)
        connection = await natsconn.connect(nats_url, "chaos-fencing")
        nc = connection.client
        answers = Answers(nc)
        try:
            movers, held = await seed(kube, holds=3, movers=60)
            a.start()
            await a.wait_ready()
            await wait_for(lambda: owns(a), within=10)
            await answers.open()
            snapshot = await natsconn.request(
                nc, subjects.accounting("snapshot", "node-1"), b'{"node":"node-1"}', 2
            )
            revision = orjson.loads(snapshot.data)["revision"]
            for i, uid in enumerate(held):
                body = {
                    "podUID": uid,
                    "podNamespace": "ml",
                    "podName": f"held-{i}",
                    "revision": revision + i,
                    "allocated": f"GPU-b,NVIDIA,{POD_MEM},10:;",
                    "node": "node-1",
                }
                reply = await natsconn.request(
                    nc, subjects.accounting("reserve", "node-1"), orjson.dumps(body), 2
                )
                assert orjson.loads(reply.data)["ok"], reply.data
            b.start()
            for target in movers:
                meta = target["metadata"]
                await answers.send("move", move_body(meta, "GPU-b", POD_MEM), meta["name"])
                await nc.flush()
                await asyncio.sleep(0.02)  # a steady stream across the join, not a wait
            await wait_for(lambda: owns(b), within=15)
            # Answers still on their way (a request A received before its drain) are given
            # the deadline to come; a second answer would come by then.
            with contextlib.suppress(TimeoutError):
                await wait_for(lambda: bool(answers.twice()), within=3)
            current = await list_pods(kube)
        finally:
            await connection.close()
            stop_all([b, a])
            await kube.api.close()
    context = f"twice: {answers.twice()}\nA:\n{a.tail(20)}\nB:\n{b.tail(20)}"
    assert answers.twice() == {}, context
    by_name = {p["metadata"]["name"]: p for p in current}
    for inbox, about in answers.sent.items():
        got = answers.got.get(inbox, [])
        if got and not got[0]["ok"]:
            assert on_gpu(by_name[about]) == "GPU-a", f"{about} moved after a refusal; {context}"
    assert gpu_b_memory(current) <= GPU_B_MEM, context


async def test_a_paused_owner_carries_out_nothing_it_reads_late(
    nats_url: str, tmp_path: Path
) -> None:
    """The owner of the node is stopped (SIGSTOP) past its lease; the other replica takes
    over and refuses a move to the full GPU-b (`no_fit`), then a refit frees room there. The
    old owner, continued, reads the move late: it must not carry it out (before the fix it did,
    once the partition came back to it, and the pod ended on the GPU that refused it)."""
    first, second = names_where_first_wants_the_partition()
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        kube = await kube_for(kubeconfig)
        bucket = f"fencing-pause-{tmp_path.name[-30:]}"
        a = replica(first, nats_url, kubeconfig, tmp_path, bucket)
        b = replica(second, nats_url, kubeconfig, tmp_path, bucket)
        refit_service = service("refit", nats_url, kubeconfig, tmp_path)
        connection = await natsconn.connect(nats_url, "chaos-fencing")
        nc = connection.client
        answers = Answers(nc)
        paused = False
        try:
            await create(
                kube,
                "node",
                node("node-1", [gpu("GPU-a", 0, mem=80000), gpu("GPU-b", 1, mem=GPU_B_MEM)]),
            )
            x = await create(kube, "pod", reserved_pod("x", "GPU-a", 30000, 10))
            filler = await create(
                kube, "pod", reserved_pod("filler", "GPU-b", 30000, 10, alignment=None)
            )
            a.start()
            await a.wait_ready()
            await wait_for(lambda: owns(a), within=10)
            b.start()
            refit_service.start()
            await b.wait_ready()
            await refit_service.wait_ready()
            assert a.process is not None
            a.process.send_signal(signal.SIGSTOP)
            paused = True
            await wait_for(lambda: owns(b), within=15)
            # A move decided on a view that thought GPU-b had room (as a refit's can be):
            # the new owner refuses it; the paused one has it in its socket, unread.
            await answers.open()
            meta = x["metadata"]
            await answers.send("move", move_body(meta, "GPU-b", 30000), "x")
            await wait_for(lambda: bool(answers.got), within=5)
            [[refused]] = list(answers.got.values())
            assert refused["code"] == "no_fit", refused
            # Free GPU-b: the filler moves to GPU-a (through the new owner).
            body = refit_body(filler, ["GPU-a"], timeoutMs=2000)
            freed = orjson.loads(
                (await natsconn.request(nc, subjects.refit("node-1"), orjson.dumps(body), 5)).data
            )
            assert freed["code"] == "moved", freed
            a.process.send_signal(signal.SIGCONT)
            paused = False
            # The partition comes back to its wanted owner; anything it kept would be carried
            # out by then.
            await wait_for(lambda: owns(a), within=15)

            async def x_moved() -> bool:
                pods = {p["metadata"]["name"]: p for p in await list_pods(kube)}
                return on_gpu(pods["x"]) == "GPU-b"

            with contextlib.suppress(TimeoutError):
                await wait_for(lambda: x_moved() if not answers.twice() else _true(), within=4)
            current = await list_pods(kube)
        finally:
            if paused and a.process is not None:
                a.process.send_signal(signal.SIGCONT)
            await connection.close()
            stop_all([refit_service, b, a])
            await kube.api.close()
    context = f"answers {dict(answers.got)}\nA:\n{a.tail(30)}\nB:\n{b.tail(20)}"
    by_name = {p["metadata"]["name"]: p for p in current}
    assert answers.twice() == {}, context
    assert on_gpu(by_name["x"]) == "GPU-a", f"x was refused, then moved anyway; {context}"
    assert on_gpu(by_name["filler"]) == "GPU-a", context


async def test_an_owner_paused_with_its_write_in_flight_never_lets_it_land_late(
    nats_url: str, tmp_path: Path
) -> None:
    """The issue's case across a pause: the owner sends X's move to GPU-b (40000 MiB, empty)
    and the API server holds the PATCH; the owner is stopped (SIGSTOP) past its lease; the
    other replica takes over, lists the pods (X's write is not there yet) and moves Y, Z and W
    (12000 MiB each) to GPU-b. Before the fix X's write then landed: 48000/40000 MiB. Now the
    new owner learns of the write under way (its recorded intent) and fences it before it
    serves: the late write can never land."""
    first, second = names_where_first_wants_the_partition()
    async with KubeEmulator() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        kube = await kube_for(kubeconfig)
        bucket = f"fencing-inflight-{tmp_path.name[-30:]}"
        a = replica(first, nats_url, kubeconfig, tmp_path, bucket)
        b = replica(second, nats_url, kubeconfig, tmp_path, bucket)
        refit_service = service("refit", nats_url, kubeconfig, tmp_path)
        connection = await natsconn.connect(nats_url, "chaos-fencing")
        nc = connection.client
        paused = False
        replies: dict[str, dict[str, Any]] = {}
        try:
            movers, _ = await seed(kube, holds=0, movers=4)
            x, *others = movers
            a.start()
            await a.wait_ready()
            await wait_for(lambda: owns(a), within=10)
            b.start()
            refit_service.start()
            await b.wait_ready()
            await refit_service.wait_ready()
            # Long enough for the takeover and the three moves to happen while it is held.
            # (The refit's own request gives up long before: X's refit is not answered ok.)
            emulator.faults.add(
                method="PATCH",
                path_regex=r"/namespaces/ml/pods/mover-0$",
                delay_s=9.0,
                times=1,
                outlive_client=True,
            )
            x_refit = asyncio.ensure_future(refit(nc, x, wait=10))
            await wait_for(lambda: emulator.faults.in_flight == 1, within=5)
            assert a.process is not None
            a.process.send_signal(signal.SIGSTOP)
            paused = True
            await wait_for(lambda: owns(b), within=15)
            for other in others:
                name = other["metadata"]["name"]

                async def moved(target: dict[str, Any] = other, key: str = name) -> bool:
                    replies[key] = await refit(nc, target)
                    return replies[key].get("succeeded") is True

                with contextlib.suppress(TimeoutError):
                    await wait_for(moved, within=8)
            # The held PATCH is served (after its delay) while its sender is still stopped:
            # nothing of the sender can settle it now.
            await wait_for(lambda: emulator.faults.in_flight == 0, within=15)
            a.process.send_signal(signal.SIGCONT)
            paused = False
            replies["mover-0"] = await x_refit
            current = await list_pods(kube)
        finally:
            if paused and a.process is not None:
                a.process.send_signal(signal.SIGCONT)
            await connection.close()
            stop_all([refit_service, b, a])
            await kube.api.close()
    context = f"replies {replies}\nA:\n{a.tail(30)}\nB:\n{b.tail(30)}"
    assert gpu_b_memory(current) <= GPU_B_MEM, context
    by_name = {p["metadata"]["name"]: p for p in current}
    for name, reply in replies.items():
        where = on_gpu(by_name[name])
        assert where == ("GPU-b" if reply.get("succeeded") else "GPU-a"), f"{name}: {context}"
    # X's write was fenced, so the three others fit GPU-b exactly.
    assert [replies[o["metadata"]["name"]].get("code") for o in others] == ["moved"] * 3, context
