"""accounting's pod watch expires (ERROR 410 Gone) and its relist fails once (500).

The API server ends a watch it can no longer serve with 410; the client must list again, and
that list can fail too (an API server restarting, a load balancer in between). Accounting must
keep trying (with backoff) instead of giving up on the watch: a pod change after all this
still reaches the ledger.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import keys
from tests.builders import gpu, node
from tests.chaos.support import reserved_pod
from tests.integration.harness import Harness, harness, wait_for
from tests.integration.test_refit_over_nats import for_create

if TYPE_CHECKING:
    from pathlib import Path


async def tracked(h: Harness) -> dict[str, str]:
    """name -> allocated annotation of every pod accounting tracks on node-1."""
    reply = await h.client.snapshot("node-1")
    return {
        t["pod"]["metadata"]["name"]: t["pod"]["metadata"]["annotations"][keys.ALLOCATED]
        for t in reply["nodes"][0]["pods"]
    }


async def test_the_ledger_follows_pods_after_a_410_and_a_failed_relist(
    nats_url: str, tmp_path: Path
) -> None:
    objects = [
        ("node", node("node-1", [gpu("GPU-a", 0), gpu("GPU-b", 1)])),
        ("pod", for_create(reserved_pod("first", "GPU-a", 10000, 10))),
    ]
    async with harness(nats_url, tmp_path, objects, with_refit=False) as h:
        assert h.kube is not None
        assert set(await tracked(h)) == {"first"}
        relist = h.emulator.faults.add(
            method="GET", path_regex=r"^/api/v1/pods(\?|$)", watch=False, status=500, times=1
        )

        # accounting's pod watch (the only one open) ends with ERROR 410 Gone ...
        assert h.emulator.expire_watches("pods") == 1
        # ... so accounting lists the pods again, and that list fails.
        await wait_for(lambda: relist.hits == 1, within=5)

        # Later changes: a new pod placed by someone else, and the first one deleted.
        await h.create("pod", for_create(reserved_pod("second", "GPU-b", 20000, 20)))
        await h.kube.delete_pod("ml", "first")

        async def caught_up() -> bool:
            return await tracked(h) == {"second": "GPU-b,NVIDIA,20000,20:;"}

        try:
            await wait_for(caught_up, within=10)
        except TimeoutError:
            raise AssertionError(
                f"10 s after a 410 and a failed relist the ledger still holds {await tracked(h)}"
            ) from None
