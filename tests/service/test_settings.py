"""Settings declared once (shared.service.declare): flags over environment over defaults,
resolved once, with bad values refused in one line naming the flag or the variable."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from shared.core.config import CoreConfig
from shared.service.declare import (
    SettingsParser,
    declared_settings,
    group,
    listing,
    member,
    setting,
    switch,
)
from shared.service.settings import CommonSettings, gpu_scheduler_policy
from shared.service.values import boolean, seconds, whole
from svc_accounting.__main__ import build_parser as accounting_parser
from svc_accounting.settings import AccountingOptions
from svc_deviceplugin.__main__ import build_parser as deviceplugin_parser
from svc_deviceplugin.settings import DevicePluginSettings, plugin_config
from svc_refit.__main__ import build_parser as refit_parser
from svc_refit.settings import RefitOptions
from svc_scheduler.__main__ import build_parser as scheduler_parser
from svc_scheduler.settings import SchedulerOptions

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence


def _names(values: Sequence[str]) -> tuple[str, ...]:
    names = tuple(part.strip() for value in values for part in value.split(",") if part.strip())
    if not names:
        raise ValueError("at least one name is needed")
    return names


@dataclass(frozen=True, slots=True)
class Example:
    timeout: float = setting(2.5, "how long", unit="s")
    count: int = setting(3, "how many", parse=whole(1, 9))
    mode: str = setting("a", "which", choices=("a", "b"), flag="--the-mode")
    old: str = setting("x", "an old one", aliases=("OLD_NAME",))
    quiet: bool = switch("say less")
    names: tuple[str, ...] = listing(("n",), "names", parse=_names)
    config: CoreConfig = group(CoreConfig, gpu_scheduler_policy=gpu_scheduler_policy())
    not_a_flag: int = 7


def parser(env: dict[str, str]) -> SettingsParser:
    made = SettingsParser(prog="example", env=env)
    made.declare(Example)
    return made


def resolved(argv: list[str], env: dict[str, str] | None = None) -> Example:
    made = parser(env or {})
    return made.resolve(Example, made.parse_args(argv))


def test_defaults_are_the_fields_own() -> None:
    assert resolved([]) == Example()
    assert resolved([]) == Example(2.5, 3, "a", "x", False, ("n",), CoreConfig(), 7)


def test_the_environment_sets_what_no_flag_does_and_a_flag_wins() -> None:
    env = {
        "NUMAFIT_TIMEOUT": "4",
        "NUMAFIT_COUNT": "5",
        "NUMAFIT_THE_MODE": "b",
        "NUMAFIT_QUIET": "yes",
        "NUMAFIT_NAMES": "p, q",
        "NUMAFIT_GPU_SCHEDULER_POLICY": "binpack",
    }
    from_env = resolved([], env)
    assert (from_env.timeout, from_env.count, from_env.mode, from_env.quiet) == (4.0, 5, "b", True)
    assert from_env.names == ("p", "q")
    assert from_env.config == CoreConfig(gpu_scheduler_policy="binpack")
    flags = ["--timeout", "1.5", "--count", "2", "--the-mode", "a", "--names", "z"]
    flags += ["--gpu-scheduler-policy", "spread"]
    from_flags = resolved(flags, env)
    assert (from_flags.timeout, from_flags.count, from_flags.mode) == (1.5, 2, "a")
    assert from_flags.names == ("z",)  # flags replace the environment's list, not add to it
    assert from_flags.config.gpu_scheduler_policy == "spread"
    assert from_flags.quiet is True  # a switch cannot be turned off by a flag: env said on


def test_a_deprecated_variable_is_read_after_the_numafit_one() -> None:
    assert resolved([], {"OLD_NAME": "y"}).old == "y"
    assert resolved([], {"OLD_NAME": "y", "NUMAFIT_OLD": "z"}).old == "z"


def test_an_empty_list_variable_means_the_default() -> None:
    assert resolved([], {"NUMAFIT_NAMES": ""}).names == ("n",)


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"NUMAFIT_TIMEOUT": "soon"}, "NUMAFIT_TIMEOUT: 'soon' is not a number of seconds"),
        ({"NUMAFIT_TIMEOUT": "-1"}, "NUMAFIT_TIMEOUT: '-1': must be a positive number"),
        ({"NUMAFIT_TIMEOUT": "nan"}, "NUMAFIT_TIMEOUT: 'nan': must be a positive number"),
        ({"NUMAFIT_COUNT": "10"}, "NUMAFIT_COUNT: '10': must be between 1 and 9"),
        ({"NUMAFIT_THE_MODE": "c"}, "NUMAFIT_THE_MODE: 'c' is not one of a, b"),
        ({"NUMAFIT_QUIET": "maybe"}, "NUMAFIT_QUIET: 'maybe' is not true or false"),
        ({"NUMAFIT_NAMES": " , "}, "NUMAFIT_NAMES: at least one name is needed"),
        ({"NUMAFIT_GPU_SCHEDULER_POLICY": "binpak"}, "NUMAFIT_GPU_SCHEDULER_POLICY: 'binpak' is"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it_exit_2(
    env: dict[str, str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        resolved([], env)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"example: error: {line}"), err
    assert err.count("\n") == 1


def test_a_huge_bad_variable_is_cut_in_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        resolved([], {"NUMAFIT_COUNT": "9" * 10_000})
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 300


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--timeout", "0"], "argument --timeout: '0': must be a positive number of seconds"),
        (["--count", "x"], "argument --count: 'x' is not a whole number"),
        (["--the-mode", "c"], "argument --the-mode: invalid choice: 'c'"),
        (["--names", ","], "--names: at least one name is needed"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        resolved(argv)
    assert exited.value.code == 2
    assert fragment in capsys.readouterr().err


def test_help_names_every_variable_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser({"NUMAFIT_TIMEOUT": "99"}).parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "how long (more than 0; env NUMAFIT_TIMEOUT; default 2.5 s)" in out  # not the env's
    assert "how many (1 to 9; env NUMAFIT_COUNT; default 3)" in out
    assert "an old one (env NUMAFIT_OLD, or OLD_NAME (deprecated); default x)" in out
    assert "say less (env NUMAFIT_QUIET=true; default off)" in out
    assert "names (env NUMAFIT_NAMES (comma-separated); default n)" in out
    assert "--not-a-flag" not in out


def test_the_parsers_refuse_what_they_should() -> None:
    assert seconds(allow_zero=True)("0") == 0.0
    with pytest.raises(ValueError, match="positive"):
        seconds()("inf")
    assert [boolean(v) for v in ("1", "TRUE", " on ", "no", "", "Off")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    with pytest.raises(ValueError, match="at least 0"):
        whole(0)("-1")
    assert member("x").parse("y") == "y"


# --- the services -----------------------------------------------------------------------------


def test_each_service_default_is_declared_once_and_the_cli_resolves_it() -> None:
    cases: list[tuple[Callable[[str, dict[str, str]], SettingsParser], type[Any]]] = [
        (accounting_parser, AccountingOptions),
        (refit_parser, RefitOptions),
        (scheduler_parser, SchedulerOptions),
        (deviceplugin_parser, DevicePluginSettings),
    ]
    for build, cls in cases:
        made = build("numafit run x", {})
        assert made.resolve(cls, made.parse_args([])) == cls()


def test_accounting_partitions_are_the_same_in_the_cli_and_embedded() -> None:
    # The cause of this module: 16 in the options, 0 in the constructor, once.
    made = accounting_parser("numafit run accounting", {})
    assert made.resolve(AccountingOptions, made.parse_args([])).partitions == 16
    assert AccountingOptions().partitions == 16
    env = {"NUMAFIT_PARTITIONS": "0", "NUMAFIT_WRITE_TIMEOUT": "0.5"}
    made = accounting_parser("numafit run accounting", env)
    chosen = made.resolve(AccountingOptions, made.parse_args(["--write-timeout", "1"]))
    assert (chosen.partitions, chosen.write_timeout) == (0, 1.0)


def test_accounting_partitions_stop_at_the_subjects_slots(
    capsys: pytest.CaptureFixture[str],
) -> None:
    made = accounting_parser("numafit run accounting", {})
    assert made.parse_args(["--partitions", "256"]).partitions == 256
    with pytest.raises(SystemExit) as exited:
        made.parse_args(["--partitions", "257"])
    assert exited.value.code == 2
    assert "'257': must be between 0 and 256" in capsys.readouterr().err


def test_every_common_setting_has_a_numafit_variable() -> None:
    for made in (
        accounting_parser("a", {}),
        refit_parser("r", {}),
        scheduler_parser("s", {}),
        deviceplugin_parser("d", {}),
    ):
        flags = {s.flag for s in made.settings}
        assert {s.flag for s in declared_settings(CommonSettings)} <= flags
        for declared in made.settings:
            assert declared.env == "NUMAFIT_" + declared.flag[2:].upper().replace("-", "_")


def test_the_device_plugin_keeps_node_name_as_a_deprecated_alias() -> None:
    made = deviceplugin_parser("numafit run deviceplugin", {"NODE_NAME": "node-1"})
    flags = made.resolve(DevicePluginSettings, made.parse_args([]))
    assert flags.node == "node-1"
    made = deviceplugin_parser("d", {"NODE_NAME": "node-1", "NUMAFIT_NODE": "node-2"})
    assert made.resolve(DevicePluginSettings, made.parse_args([])).node == "node-2"


def test_the_device_plugin_config_follows_its_flags() -> None:
    made = deviceplugin_parser("d", {"NUMAFIT_NO_REFIT": "1", "NUMAFIT_STATE_DIR": ""})
    argv = ["--node", "n1", "--operating-mode", "mig", "--hami-core-dir", "/opt/v"]
    config = plugin_config(made.resolve(DevicePluginSettings, made.parse_args(argv)))
    assert (config.node, config.refit_enabled, config.mig_mode, config.state_dir) == (
        "n1",
        False,
        True,
        None,
    )
    assert config.hami_core.library_host == "/opt/v/libvgpu.so"
    assert config.hami_core.preload_host == "/opt/v/ld.so.preload"
    defaults = plugin_config(dataclasses.replace(DevicePluginSettings(), node="n1"))
    assert str(defaults.directory) == "/var/lib/kubelet/device-plugins"
    assert (defaults.replicas, defaults.refit_timeout_ms) == (10, 2000)
    assert str(defaults.state_dir) == "/var/lib/numafit/deviceplugin"


def test_the_scheduler_reads_its_names_and_port_from_the_environment() -> None:
    env = {"NUMAFIT_SCHEDULER_NAME": "a,b", "NUMAFIT_LISTEN_PORT": "9999"}
    made = scheduler_parser("s", env)
    chosen = made.resolve(SchedulerOptions, made.parse_args([]))
    assert (chosen.scheduler_names, chosen.port, chosen.ssl_context) == (("a", "b"), 9999, None)
