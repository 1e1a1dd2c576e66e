"""Every `numafit run TARGET` (and `numafit up`) as a user meets it: its help names the command
the user typed, every option is explained, and `--log-level` takes the same values everywhere,
in any case."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import pytest

from shared.tools import cli

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

LEVELS = ["debug", "info", "warning", "error"]
REQUIRED = {"sim-node": ["--topology", "gpus.yaml"]}
"""What a target's parser needs besides the option under test."""


def parser_of(target: str) -> argparse.ArgumentParser:
    from shared.testing.kube_emulator.cli import build_parser as kube_emulator
    from shared.testing.kubelet_emulator.cli import build_parser as kubelet_emulator
    from shared.tools.simulate.sim_node import build_parser as sim_node
    from svc_accounting.__main__ import build_parser as accounting
    from svc_deviceplugin.__main__ import build_parser as deviceplugin
    from svc_refit.__main__ import build_parser as refit
    from svc_scheduler.__main__ import build_parser as scheduler

    builders: dict[str, Callable[[], argparse.ArgumentParser]] = {
        "accounting": accounting,
        "refit": refit,
        "scheduler": scheduler,
        "deviceplugin": deviceplugin,
        "kube-emulator": kube_emulator,
        "kubelet-emulator": kubelet_emulator,
        "sim-node": sim_node,
    }
    if target == "up":
        up = argparse.ArgumentParser(prog="numafit up")
        from shared.tools.local.command import add_arguments

        add_arguments(up)
        return up
    return builders[target]()


TARGETS = sorted(cli.RUN_TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_help_names_the_command_typed(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", target, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: numafit run {target} [-h]")


@pytest.mark.parametrize("target", [*TARGETS, "up"])
def test_every_option_is_explained(target: str) -> None:
    for action in parser_of(target)._actions:
        assert action.help and action.help != argparse.SUPPRESS, (
            f"{target} {'/'.join(action.option_strings)} has no help"
        )


@pytest.mark.parametrize("target", [*TARGETS, "up"])
def test_log_level_takes_the_same_values_everywhere_in_any_case(target: str) -> None:
    parser = parser_of(target)
    (action,) = [a for a in parser._actions if "--log-level" in a.option_strings]
    assert list(action.choices or []) == LEVELS
    needs = REQUIRED.get(target, [])
    assert parser.parse_args(needs).log_level == "info"
    for given, meant in (("INFO", "info"), ("info", "info"), ("Warning", "warning")):
        assert parser.parse_args([*needs, "--log-level", given]).log_level == meant


@pytest.mark.parametrize("target", [*TARGETS, "up"])
def test_an_unknown_log_level_is_a_usage_error(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parser_of(target).parse_args([*REQUIRED.get(target, []), "--log-level", "verbose"])
    assert exited.value.code == 2
    assert "invalid choice: 'verbose'" in capsys.readouterr().err


def test_sim_node_refuses_a_bad_topology_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from shared.tools.simulate.sim_node import main

    topology = tmp_path / "gpus.yaml"
    topology.write_text("gpus:\n  - {uuid: GPU-a, model: NVIDIA H100, memory: lots, numa: 0}\n")
    assert main(["--topology", str(topology)]) == 2  # as the device plugin, scenarios, plan
    err = capsys.readouterr().err
    assert err.startswith(f"numafit run sim-node: {topology}: ") and err.count("\n") == 1
    assert "'memory' must be an integer" in err
