"""The emulator calling svc_scheduler's /webhook over HTTP, as an API server would (compose)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from shared.service import kube_io
from shared.testing.kube_emulator.remote_webhook import remote_webhook
from svc_scheduler.service import SchedulerService
from svc_scheduler.settings import SchedulerOptions
from tests.builders import container, pod
from tests.integration.harness import harness
from tests.integration.test_refit_over_nats import for_create

if TYPE_CHECKING:
    from pathlib import Path


async def test_pods_are_admitted_through_the_http_webhook(nats_url: str, tmp_path: Path) -> None:
    async with harness(nats_url, tmp_path, []) as h:
        scheduler = SchedulerService(
            await h._nats("scheduler"),
            await h._kube("scheduler"),
            SchedulerOptions(host="127.0.0.1", port=0),
        )
        await scheduler.start()
        try:
            h.emulator.admission = remote_webhook(f"{scheduler.url}/webhook")
            assert h.kube is not None
            created = await h.kube.create_pod(
                "ml", for_create(pod("gpu", containers=[container("c", 1, 1000)], namespace="ml"))
            )
            assert created["spec"]["schedulerName"] == "numafit-scheduler"
            typo = for_create(
                pod(
                    "typo",
                    containers=[container("c", 1, 1000)],
                    namespace="ml",
                    annotations={"hami.io/numa-alignment": "maybe"},
                )
            )
            with pytest.raises(kube_io.KubeError, match="numa-alignment value 'maybe' is invalid"):
                await h.kube.create_pod("ml", typo)
        finally:
            await scheduler.stop(1.0)
        # The webhook is gone: failurePolicy Fail refuses, Ignore admits.
        h.emulator.admission = remote_webhook(f"{scheduler.url}/webhook", timeout=1)
        with pytest.raises(kube_io.KubeError, match="failed calling webhook"):
            await h.kube.create_pod(
                "ml", for_create(pod("late", containers=[container("c")], namespace="ml"))
            )
        h.emulator.admission = remote_webhook(
            f"{scheduler.url}/webhook", timeout=1, ignore_failure=True
        )
        await h.kube.create_pod(
            "ml", for_create(pod("later", containers=[container("c")], namespace="ml"))
        )
