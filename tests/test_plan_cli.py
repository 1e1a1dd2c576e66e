"""`numafit plan` and `numafit demo` as a user runs them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shared.core import keys
from shared.tools import cli
from tests.builders import case, container, gpu, node, pod, refit_request

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "shared" / "data" / "plan-worked-example.json"


def run(args: list[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    if args[0] == "plan":
        explain = "--explain" in args
        path = next(a for a in args[1:] if a != "--explain")
        code = cli.plan_command(path, explain, out, err, io.StringIO(stdin))
    else:
        raise AssertionError(args)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, body: Any) -> str:
    path = tmp_path / "case.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return str(path)


def test_plan_prints_the_decision_and_exits_zero() -> None:
    code, out, err = run(["plan", str(EXAMPLE)])
    assert code == 0 and err == ""
    answer = json.loads(out)
    assert answer["code"] == "moved" and answer["containerDevices"] == "GPU-b,NVIDIA,20000,30:"


def test_a_refusal_is_still_exit_zero(tmp_path: Path) -> None:
    obj = json.loads(EXAMPLE.read_text())
    obj["request"]["allowedDeviceUUIDs"] = []
    code, out, _ = run(["plan", write(tmp_path, obj)])
    assert code == 0 and json.loads(out)["code"] == "invalid_request"


def test_plan_reads_standard_input() -> None:
    code, out, _ = run(["plan", "-"], stdin=EXAMPLE.read_text())
    assert code == 0 and json.loads(out)["succeeded"] is True


def _example() -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(EXAMPLE.read_text())
    return obj


def _without_uid() -> dict[str, Any]:
    obj = _example()
    del obj["pods"][0]["metadata"]["uid"]
    return obj


def _bad_register() -> dict[str, Any]:
    obj = _example()
    obj["node"]["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "[{oops"
    return obj


def _bad_request_type() -> dict[str, Any]:
    obj = _example()
    obj["request"]["containerIndex"] = "1"
    return obj


def _bad_allowed() -> dict[str, Any]:
    obj = _example()
    obj["request"]["allowedDeviceUUIDs"] = "GPU-b"
    return obj


def _unknown_key() -> dict[str, Any]:
    obj = _example()
    obj["nodes"] = []
    return obj


def _bad_config() -> dict[str, Any]:
    obj = _example()
    obj["config"] = {"gpuSchedulerPolicy": 3}
    return obj


def _config(**config: Any) -> dict[str, Any]:
    obj = _example()
    obj["config"] = config
    return obj


def _bad_mode() -> dict[str, Any]:
    obj = _example()
    obj["request"]["mode"] = "maybe"
    return obj


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("{not json", "is not valid JSON"),
        ("[]", "case must be a JSON object"),
        (_without_uid(), "has no metadata.uid"),
        (_bad_register(), "hami.io/node-nvidia-register"),
        (_bad_request_type(), "Expected `int`, got `str` - at `$.containerIndex`"),
        (_bad_allowed(), "at `$.allowedDeviceUUIDs`"),
        (_unknown_key(), "unknown case key(s) nodes"),
        (_bad_config(), "'gpuSchedulerPolicy' must be a non-empty string"),
        (_bad_mode(), "mode must be 'best-effort' or 'strict'"),
        (
            _config(gpuSchedulerPolicy="bogus"),
            "config 'gpuSchedulerPolicy': 'bogus' is not a GPU policy: use one of binpack, "
            "spread, numa, mutex, topology-aware, or a comma chain of them such as binpack,numa",
        ),
        (_config(gpuSchedulerPolicy="binpack,nmua"), "'binpack,nmua' is not a GPU policy"),
        (
            _config(nodeSchedulerPolicy="fill"),
            "config 'nodeSchedulerPolicy': 'fill' is not a node policy: use binpack or spread",
        ),
        ({"node": {"metadata": {"name": "n"}}}, "case has no 'request'"),
    ],
)
def test_malformed_cases_exit_two_with_one_line(tmp_path: Path, body: Any, fragment: str) -> None:
    code, out, err = run(["plan", write(tmp_path, body)])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and fragment in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "config",
    [
        {"gpuSchedulerPolicy": "binpack"},
        {"gpuSchedulerPolicy": "Spread"},
        {"gpuSchedulerPolicy": "numa"},
        {"gpuSchedulerPolicy": "binpack, numa"},
        {"gpuSchedulerPolicy": "mutex"},
        {"gpuSchedulerPolicy": "topology-aware"},
        {"nodeSchedulerPolicy": "spread"},
    ],
)
def test_every_policy_hami_knows_is_accepted(tmp_path: Path, config: dict[str, str]) -> None:
    code, out, err = run(["plan", write(tmp_path, _config(**config))])
    assert code == 0 and err == "" and json.loads(out)["succeeded"] is True


def test_missing_file_exits_two() -> None:
    code, _, err = run(["plan", "/nonexistent/case.json"])
    assert code == 2 and "cannot read" in err


def test_explain_says_what_was_considered_refused_and_moved(tmp_path: Path) -> None:
    target = pod(
        "t",
        init=[container("prep", 1, 30000)],
        containers=[container("main", 1, 20000)],
        allocated="GPU-b,NVIDIA,30000,0:;GPU-a,NVIDIA,20000,0:;",
        annotations={"hami.io/gpu-scheduler-policy": "binpack"},
    )  # tries the fuller GPU-c first
    busy = pod("busy", containers=[container("c", 1, 35000)], allocated="GPU-c,NVIDIA,35000,0:;")
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0), gpu("GPU-c", 0)])
    body = case(nodes, [target, busy], refit_request(target, 1, ["GPU-b", "GPU-c"]))
    code, out, _ = run(["plan", "--explain", write(tmp_path, body)])
    assert code == 0
    assert "GPU-a" in out and "not in kubelet's allowed set" in out
    assert "refused: CardInsufficientMemory" in out  # GPU-c
    assert "PICKED" in out and "code moved" in out
    assert "moved container 1 from GPU-a to GPU-b" in out
    assert "before: GPU-b,NVIDIA,30000,0:;GPU-a,NVIDIA,20000,0:;" in out


def test_explain_of_a_refusal_gives_the_reason(tmp_path: Path) -> None:
    obj = _example()
    obj["request"]["nodeName"] = "node-9"
    code, out, _ = run(["plan", "--explain", write(tmp_path, obj)])
    assert code == 0 and "code node_mismatch" in out and "is tracked on node node-1" in out


def _crowded_case(mode: str) -> dict[str, Any]:
    """The worked example's app (20000 MiB, 30 % cores) refused: kubelet allows GPU-b, whose
    other pod and this pod's init leave 25000 of 40000 MiB in use, and GPU-c, 35000 in use."""
    target = pod(
        "train",
        init=[container("prep", 1, 30000, 60)],
        containers=[container("main", 1, 20000, 30)],
        allocated="GPU-b,NVIDIA,30000,60:;GPU-a,NVIDIA,20000,30:;",
        to_allocate=";GPU-a,NVIDIA,20000,30:;",
        namespace="ml",
    )
    others = [
        pod("other", containers=[container("c", 1, 15000)], allocated="GPU-b,NVIDIA,15000,0:;"),
        pod("big", containers=[container("c", 1, 35000)], allocated="GPU-c,NVIDIA,35000,0:;"),
    ]
    nodes = node("node-1", [gpu("GPU-a", 1), gpu("GPU-b", 0), gpu("GPU-c", 0)])
    return case(nodes, [target, *others], refit_request(target, 1, ["GPU-b", "GPU-c"], mode=mode))


def test_explain_of_a_best_effort_refusal_names_the_overcommit_of_each_choice(
    tmp_path: Path,
) -> None:
    code, out, _ = run(["plan", "--explain", write(tmp_path, _crowded_case("best-effort"))])
    assert code == 0 and "code no_fit" in out
    # 25000 + 20000 on GPU-b, 35000 + 20000 on GPU-c, each of 40000 MiB.
    assert (
        "    if kubelet picks GPU-b: aligned, but GPU-b is over-committed by a best-effort "
        "fallback (45000/40000 MiB)\n"
    ) in out
    assert (
        "    if kubelet picks GPU-c: aligned, but GPU-c is over-committed by a best-effort "
        "fallback (55000/40000 MiB)\n"
    ) in out


def test_explain_of_a_best_effort_refusal_where_a_choice_fits(tmp_path: Path) -> None:
    body = _crowded_case("best-effort")
    body["pods"] = body["pods"][:2]  # GPU-c is free
    body["pods"][0]["metadata"]["annotations"][keys.USE_UUID] = "GPU-a"  # pinned
    code, out, _ = run(["plan", "--explain", write(tmp_path, body)])
    assert code == 0 and "CardUuidMismatch" in out
    assert "if kubelet picks GPU-b: aligned, but GPU-b is over-committed" in out
    assert "if kubelet picks GPU-c: aligned, and no GPU is over-committed\n" in out


def test_explain_of_a_strict_refusal_says_nothing_runs(tmp_path: Path) -> None:
    code, out, _ = run(["plan", "--explain", write(tmp_path, _crowded_case("strict"))])
    assert code == 0 and "code no_fit" in out
    assert "strict mode: the container's admission fails" in out
    assert "if kubelet picks" not in out


def test_explain_of_the_bundled_worked_example() -> None:
    code, out, _ = run(["plan", "--explain", str(EXAMPLE)])
    assert code == 0
    assert "moved container 1 from GPU-a to GPU-b" in out
    assert "slots 1/10, mem 30000/40000 MiB" in out  # max(init 30000, app 20000), not 50000


def test_console_script_is_installed_and_helpful() -> None:
    exe = Path(sys.executable).with_name("numafit")
    result = subprocess.run(
        [str(exe), "plan", "--help"], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0 and "Exits 0 for every decision" in " ".join(
        result.stdout.split()
    )
    bad = subprocess.run(
        [str(exe), "plan", "/nonexistent"], capture_output=True, text=True, check=False, timeout=60
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
