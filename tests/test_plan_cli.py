"""`numafit plan` and `numafit demo` as a user runs them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shared import cli
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
        ({"node": {"metadata": {"name": "n"}}}, "case has no 'request'"),
    ],
)
def test_malformed_cases_exit_two_with_one_line(tmp_path: Path, body: Any, fragment: str) -> None:
    code, out, err = run(["plan", write(tmp_path, body)])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and fragment in err
    assert "Traceback" not in err


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
