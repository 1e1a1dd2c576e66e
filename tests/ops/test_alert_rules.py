"""The alert rules evaluated by promtool's rule unit tests: given series over time, which alerts
fire, when, and with which labels and text. Skipped where promtool is not installed (`.ci/run`
installs Debian's prometheus, which ships it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "helm" / "numafit" / "files" / "alerts.yaml"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")

OVERCOMMIT = "numafit_accounting_device_memory_overcommitted_mib"
FALLBACK = "numafit_deviceplugin_fallback_containers"


def promtool_test(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    """Run `promtool test rules` on the shipped alert rules; fail with promtool's report."""
    assert PROMTOOL is not None
    spec = {"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": tests}
    path = tmp_path / "alerts-test.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


OVERCOMMITTED_DESCRIPTION = (
    "28080 MiB above the memory of GPU GPU-0 on node gpu-node-1 has been reserved for 5 "
    "minutes. Accounting follows what runs: kubelet's choice after a best-effort refit "
    "fallback, or for a pod without hami.io/numa-alignment, landed on a GPU the scheduler "
    "would not have picked. The containers there may run out of GPU memory; move a pod away, "
    "or use strict mode."
)


def test_an_overcommitted_gpu_fires_after_five_minutes_and_names_the_gpu(tmp_path: Path) -> None:
    series = [
        # GPU-0: 110000 MiB reserved on an 81920 MiB GPU from minute 2 on.
        {"series": f'{OVERCOMMIT}{{node="gpu-node-1",uuid="GPU-0"}}', "values": "0 0 28080x10"},
        # GPU-1 fits; GPU-2 is over-committed for three minutes only (a pod moved away).
        {"series": f'{OVERCOMMIT}{{node="gpu-node-1",uuid="GPU-1"}}', "values": "0x12"},
        {"series": f'{OVERCOMMIT}{{node="gpu-node-1",uuid="GPU-2"}}', "values": "0 500x2 0x9"},
    ]
    firing = {
        "exp_labels": {"severity": "warning", "node": "gpu-node-1", "uuid": "GPU-0"},
        "exp_annotations": {
            "summary": "More GPU memory is reserved on GPU-0 (gpu-node-1) than it has",
            "description": OVERCOMMITTED_DESCRIPTION,
        },
    }
    promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "6m", "alertname": "NumafitGpuOvercommitted", "exp_alerts": []},
                    {
                        "eval_time": "7m",
                        "alertname": "NumafitGpuOvercommitted",
                        "exp_alerts": [firing],
                    },
                    {
                        "eval_time": "12m",
                        "alertname": "NumafitGpuOvercommitted",
                        "exp_alerts": [firing],
                    },
                ],
            }
        ],
    )


def test_two_accounting_replicas_exporting_one_gpu_fire_one_alert(tmp_path: Path) -> None:
    series = [
        {
            "series": f'{OVERCOMMIT}{{instance="accounting-{n}:9102",node="n1",uuid="GPU-a"}}',
            "values": "100x10",
        }
        for n in (1, 2)
    ]
    description = OVERCOMMITTED_DESCRIPTION.replace("28080", "100").replace(
        "GPU-0 on node gpu-node-1", "GPU-a on node n1"
    )
    firing = {
        "exp_labels": {"severity": "warning", "node": "n1", "uuid": "GPU-a"},
        "exp_annotations": {
            "summary": "More GPU memory is reserved on GPU-a (n1) than it has",
            "description": description,
        },
    }
    promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "6m",
                        "alertname": "NumafitGpuOvercommitted",
                        "exp_alerts": [firing],
                    }
                ],
            }
        ],
    )


def test_fallback_containers_fire_after_thirty_minutes(tmp_path: Path) -> None:
    series = [{"series": f'{FALLBACK}{{node="gpu-node-1"}}', "values": "1x40"}]
    firing = {
        "exp_labels": {"severity": "info"},
        "exp_annotations": {
            "summary": "Containers run on kubelet's GPU after a best-effort refit fallback",
            "description": (
                "1 container(s) run where kubelet put them after a refused or timed-out "
                "best-effort refit; accounting counts what runs, but the scheduler's placement "
                "was not kept, and the GPU kubelet chose may now be over-committed "
                "(NumafitGpuOvercommitted). Consider strict mode or more NUMA-local capacity."
            ),
        },
    }
    promtool_test(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "29m",
                        "alertname": "NumafitFallbackContainers",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "30m",
                        "alertname": "NumafitFallbackContainers",
                        "exp_alerts": [firing],
                    },
                ],
            }
        ],
    )


DRIFT = "numafit_accounting_allocation_drift_total"
ALLOCATED = "numafit_deviceplugin_allocations_total"
ALLOCATIONS = f'{ALLOCATED}{{result="ok"}}'
REFITS = "numafit_deviceplugin_refits_total"
UNEXPLAINED = "NumafitUnexplainedAllocationDrift"


def rule(name: str) -> dict[str, Any]:
    rules = yaml.safe_load(ALERTS.read_text())
    (found,) = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == name]
    assert isinstance(found, dict)
    return found


def drift_case(
    series: list[dict[str, str]], quiet: list[str], firing: dict[str, str]
) -> dict[str, Any]:
    """One promtool case of the unexplained-drift alert: `quiet` evaluation times with no
    alert, `firing` evaluation times with the number of unexplained drifts it reports."""
    tests: list[dict[str, Any]] = [
        {"eval_time": t, "alertname": UNEXPLAINED, "exp_alerts": []} for t in quiet
    ]
    annotations = rule(UNEXPLAINED)["annotations"]
    for at, count in firing.items():
        description = annotations["description"].replace("{{ $value | humanize }}", count)
        alert = {
            "exp_labels": {"severity": "warning"},
            "exp_annotations": {"summary": annotations["summary"], "description": description},
        }
        tests.append({"eval_time": at, "alertname": UNEXPLAINED, "exp_alerts": [alert]})
    return {"interval": "1m", "input_series": series, "alert_rule_test": tests}


def test_drift_kubelet_was_free_to_choose_does_not_fire(tmp_path: Path) -> None:
    everywhere = ["5m", "30m", "1h", "2h"]
    cases = [
        # Two nodes' drift, every one of them a mismatch of a pod without
        # hami.io/numa-alignment (the plugins count them not_opted_in, and let kubelet pick):
        # what `numafit up` and compose produce from their first minute on, by design. The
        # other allocations follow the plugin's selection (moved) and do not drift.
        drift_case(
            [
                {"series": f'{DRIFT}{{node="n1"}}', "values": "0+2x150"},
                {"series": f'{DRIFT}{{node="n2"}}', "values": "0+1x150"},
                {"series": f'{ALLOCATED}{{result="ok",node="n1"}}', "values": "0+6x150"},
                {"series": f'{ALLOCATED}{{result="ok",node="n2"}}', "values": "0+2x150"},
                {
                    "series": f'{REFITS}{{mode="none",result="not_opted_in",node="n1"}}',
                    "values": "0+2x150",
                },
                {
                    "series": f'{REFITS}{{mode="none",result="not_opted_in",node="n2"}}',
                    "values": "0+1x150",
                },
                {
                    "series": f'{REFITS}{{mode="best-effort",result="moved",node="n1"}}',
                    "values": "0+4x150",
                },
                {
                    "series": f'{REFITS}{{mode="strict",result="moved",node="n2"}}',
                    "values": "0+1x150",
                },
            ],
            quiet=everywhere,
            firing={},
        ),
        # Best-effort fallbacks and timeouts: kubelet picks.
        drift_case(
            [
                {"series": f'{DRIFT}{{node="n1"}}', "values": "0+2x150"},
                {"series": ALLOCATIONS, "values": "0+2x150"},
                {
                    "series": f'{REFITS}{{mode="best-effort",result="fallback"}}',
                    "values": "0+1x150",
                },
                {"series": f'{REFITS}{{mode="best-effort",result="timeout"}}', "values": "0+1x150"},
            ],
            quiet=everywhere,
            firing={},
        ),
        # Devices kubelet reuses from an init container: it allocates them without asking the
        # plugin (an Allocate with no GetPreferredAllocation before it), and they may differ
        # from the app container's reservation. The plugin exports every outcome's series
        # from its start, not_opted_in among them, at zero here.
        drift_case(
            [
                {"series": f'{DRIFT}{{node="n1"}}', "values": "0+1x150"},
                {"series": ALLOCATIONS, "values": "0+4x150"},
                {"series": f'{REFITS}{{mode="strict",result="moved"}}', "values": "0+2x150"},
                {"series": f'{REFITS}{{mode="strict",result="no_mismatch"}}', "values": "0+1x150"},
                {"series": f'{REFITS}{{mode="none",result="not_opted_in"}}', "values": "0x150"},
            ],
            quiet=everywhere,
            firing={},
        ),
        # accounting's count runs a scrape ahead of the plugin's (two processes, scraped
        # apart): the difference at the window's edges is no drift to act on.
        drift_case(
            [
                {"series": f'{DRIFT}{{node="n1"}}', "values": "0+4x150"},
                {"series": ALLOCATIONS, "values": "0 0+4x149"},
                {"series": f'{REFITS}{{mode="none",result="not_opted_in"}}', "values": "0 0+4x149"},
            ],
            quiet=everywhere,
            firing={},
        ),
        # No device plugin scraped: nothing tells expected drift from unexpected, so no alert.
        drift_case(
            [{"series": f'{DRIFT}{{node="n1"}}', "values": "0+2x150"}],
            quiet=everywhere,
            firing={},
        ),
    ]
    promtool_test(tmp_path, cases)


def test_drift_against_the_plugins_selection_fires_after_ten_minutes(tmp_path: Path) -> None:
    cases = [
        # 3 allocations a minute, 2 of them on devices the plugin selected (a move, one already
        # aligned), yet 2 drift: 1 a minute, 60 in the hour, kubelet did not follow. Strict
        # failures and timeouts end in no allocation, so they change nothing.
        drift_case(
            [
                {"series": f'{DRIFT}{{node="n1"}}', "values": "0+2x150"},
                {"series": ALLOCATIONS, "values": "0+3x150"},
                {"series": f'{REFITS}{{mode="best-effort",result="moved"}}', "values": "0+1x150"},
                {
                    "series": f'{REFITS}{{mode="strict",result="already_aligned"}}',
                    "values": "0+1x150",
                },
                {"series": f'{REFITS}{{mode="none",result="not_opted_in"}}', "values": "0+1x150"},
                {"series": f'{REFITS}{{mode="strict",result="timeout"}}', "values": "0+1x150"},
                {
                    "series": f'{REFITS}{{mode="strict",result="strict_failed"}}',
                    "values": "0+1x150",
                },
            ],
            quiet=["5m"],
            firing={"30m": "30", "1h": "60", "2h": "60"},
        ),
        # A burst of 20 drifts at 30m with no allocation the plugin left to kubelet: firing
        # from ten minutes after it until it has left the hour's window.
        drift_case(
            [
                {"series": f'{DRIFT}{{node="n1"}}', "values": "0x30 20+0x120"},
                {"series": ALLOCATIONS, "values": "0x30 20+0x120"},
                {
                    "series": f'{REFITS}{{mode="best-effort",result="moved"}}',
                    "values": "0x30 20+0x120",
                },
            ],
            quiet=["29m", "35m", "95m"],
            firing={"45m": "20", "80m": "20"},
        ),
    ]
    promtool_test(tmp_path, cases)
