"""The settings reference (docs/reference/settings.md), written from the declarations.

`settings_reference` renders one markdown table per service from the same `Setting`s its
parser was built from, so the page and `numafit run <service> --help` say the same;
`scripts/settings_reference.py` writes (or checks) the page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.service.declare import Setting, SettingsParser

TITLE = "# Settings: flags and environment"
INTRO = """\
Every flag of `numafit run <service>` can be given as an environment variable instead:
`NUMAFIT_` and the flag's name in capitals with `_` for `-` (`--write-timeout` is
`NUMAFIT_WRITE_TIMEOUT`). A flag wins over its variable, the variable over the default; they
are read once, at start. A bad variable is one line naming it, a bad flag argparse's usage and
the error; both exit with status 2. A switch's variable is true with `1`, `true`, `yes` or `on`
(`0`, `false`, `no`, `off` or empty: off; a switch has no flag that turns it off, so one its
variable turns on stays on). A list's variable is comma-separated, and flags given replace it.
Variables marked deprecated are older names, read when the `NUMAFIT_` one is absent. Commands
are not settings and have no variable: `--help`, and the device plugin's `--inventory`.

This page is generated from the settings' declarations (`svc_*/settings.py`,
`shared/service/settings.py`): `python -m scripts.settings_reference` rewrites it, and a
test fails when it and `numafit run <service> --help` disagree."""
HEADER = "| Flag | Environment | Default | Unit | Accepts | Meaning |\n|---|---|---|---|---|---|"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def setting_row(declared: Setting) -> str:
    flag = declared.flag if declared.kind == "switch" else f"{declared.flag} {_metavar(declared)}"
    cells = (
        f"`{flag}`",
        f"`{declared.env}`" + "".join(f", `{a}` (deprecated)" for a in declared.aliases),
        f"`{declared.default_text}`",
        declared.unit,
        declared.accepts,
        declared.help
        + (" (repeatable; the variable comma-separated)" if declared.kind == "list" else ""),
    )
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _metavar(declared: Setting) -> str:
    """As argparse shows it in help (the choices, when there are some)."""
    if declared.metavar:
        return declared.metavar
    if declared.choices:
        return "{" + ",".join(declared.choices) + "}"
    return declared.dest.upper()


def settings_reference(parsers: Mapping[str, SettingsParser]) -> str:
    """The page: per service (name -> its parser), one row per setting."""
    parts = [TITLE, "", INTRO]
    for service, parser in parsers.items():
        parts += ["", f"## numafit run {service}", "", HEADER]
        parts += [setting_row(declared) for declared in parser.settings]
    return "\n".join(parts) + "\n"
