"""Scenario pods are checked against the API emulator's own Pod schema: a typo in a key the Pod
API does not have, or a value of the wrong type, is one line naming the file, the line, the pod
and the key (exit 2), not a confusing BindError later or a field silently dropped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shared.tools.simulate.scenario import ScenarioError, parse_scenario

NUMAFIT = str(Path(sys.executable).with_name("numafit"))

NODE = """\
nodes:
  - name: node-1
    gpus:
      - {uuid: GPU-a, model: NVIDIA H100, memory: 81920, numa: 0}
pods:
  - metadata:
      name: typo
      namespace: e2e
      annotations: {hami.io/numa-alignment: best-effort}
      labels: {team: ml}
    spec:
      containers:
        - name: app
          image: busybox
          resources:
            limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 10000}
"""


def refusal(text: str) -> str:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(text, "s.yaml")
    return str(caught.value)


def test_the_base_scenario_is_fine() -> None:
    assert len(parse_scenario(NODE).steps) == 1


@pytest.mark.parametrize(
    ("typo", "message"),
    [
        (
            ("      annotations:", "      anotations:"),
            "s.yaml:9: pod e2e/typo: unknown key 'anotations' in metadata "
            "(did you mean 'annotations'?)",
        ),
        (
            ("          resources:", "          resourcs:"),
            "s.yaml:15: pod e2e/typo: unknown key 'resourcs' in spec.containers[0] "
            "(did you mean 'resources'?)",
        ),
        (
            ("            limits:", "            limit:"),
            "s.yaml:16: pod e2e/typo: unknown key 'limit' in spec.containers[0].resources "
            "(did you mean 'limits'?)",
        ),
        (
            ("    spec:", "    spec:\n      nodeSelectr: {gpu: 'yes'}"),
            "s.yaml:12: pod e2e/typo: unknown key 'nodeSelectr' in spec "
            "(did you mean 'nodeSelector'?)",
        ),
        (
            ("      labels: {team: ml}", "      labels: {team: 7}"),
            "s.yaml:10: pod e2e/typo: metadata.labels[team] must be a string, not an integer",
        ),
        (
            ("nvidia.com/gpu: 1,", "nvidia.com/gpu: [1],"),
            "s.yaml:16: pod e2e/typo: spec.containers[0].resources.limits[nvidia.com/gpu] must "
            "be a quantity (a number, or a string such as 100m or 4Gi), not a list",
        ),
    ],
)
def test_a_pod_key_or_value_the_api_does_not_take_is_named(
    typo: tuple[str, str], message: str
) -> None:
    old, new = typo
    assert old in NODE
    assert refusal(NODE.replace(old, new)) == message


def test_the_first_problem_by_line_is_the_one_told() -> None:
    text = NODE.replace("          resources:", "          resourcs:").replace(
        "      annotations:", "      anotations:"
    )
    assert refusal(text).startswith("s.yaml:9: pod e2e/typo: unknown key 'anotations'")


def test_simulate_exits_two_with_the_one_line(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(NODE.replace("          resources:", "          resourcs:"))
    result = subprocess.run(
        [NUMAFIT, "simulate", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"numafit simulate: {path}:15: pod e2e/typo: unknown key 'resourcs' in "
        "spec.containers[0] (did you mean 'resources'?)\n"
    )
