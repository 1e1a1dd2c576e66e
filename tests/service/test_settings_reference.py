"""docs/reference/settings.md and `numafit run <service> --help` say the same.

The page is read as an operator reads it (its markdown tables), the help as `numafit run
<service> --help` prints it, and every flag, variable, default and unit of one is checked
against the other; the page is also checked to be what the declarations generate now.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from scripts import settings_reference
from shared.tools import cli

if TYPE_CHECKING:
    from pathlib import Path

SERVICES = settings_reference.SERVICES
COMMANDS = {"--help", "--inventory"}
"""Flags that are commands, not settings: no environment variable."""
ROW = re.compile(r"(?<!\\)\|")
OPTION = re.compile(r"^  (--[\w-]+)(?: (\S+))?(?:\s{2,}(.*))?$")


def page_rows() -> dict[str, dict[str, list[str]]]:
    """service -> flag -> [flag cell, env, default, unit, accepts, meaning], from the page."""
    rows: dict[str, dict[str, list[str]]] = {}
    service = ""
    for line in settings_reference.PAGE.read_text().splitlines():
        if line.startswith("## numafit run "):
            service = line.removeprefix("## numafit run ")
            rows[service] = {}
        elif service and line.startswith("| `"):
            cells = [cell.strip().replace("\\|", "|") for cell in ROW.split(line)[1:-1]]
            rows[service][cells[0].strip("`").split()[0]] = cells
    return rows


def help_entries(
    service: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> dict[str, tuple[str, str]]:
    """flag -> (metavar, help with whitespace collapsed), from `numafit run <service> --help`
    (on a terminal wide enough that no line is wrapped: argparse breaks lines after hyphens)."""
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", service, "--help"])
    assert exited.value.code == 0
    entries: dict[str, list[str]] = {}
    current = None
    for line in capsys.readouterr().out.splitlines():
        match = OPTION.match(line)
        if match:
            current = match[1]
            entries[current] = [match[2] or "", match[3] or ""]
        elif current and line.startswith(" " * 6):
            entries[current][1] += " " + line.strip()
        else:
            current = None
    return {flag: (meta, " ".join(text.split())) for flag, (meta, text) in entries.items()}


@pytest.mark.parametrize("service", SERVICES)
def test_the_page_and_the_help_agree(
    service: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = page_rows()[service]
    entries = help_entries(service, capsys, monkeypatch)
    assert set(rows) == set(entries) - COMMANDS
    for flag, (flag_cell, env_cell, default_cell, unit, accepts, meaning) in rows.items():
        metavar, text = entries[flag]
        assert flag_cell.strip("`") == f"{flag} {metavar}".strip(), flag
        variables = re.findall(r"`([A-Z_]+)`", env_cell)
        assert variables[0] == "NUMAFIT_" + flag[2:].upper().replace("-", "_"), flag
        assert (
            f"({accepts}; env {variables[0]}" in text if accepts else f"(env {variables[0]}" in text
        ), flag
        for alias in variables[1:]:
            assert f"or {alias} (deprecated)" in text, (flag, alias)
        shown = default_cell.strip("`") + (f" {unit}" if unit else "")
        assert text.endswith(f"; default {shown})"), (flag, text)
        said = text.split(f" ({accepts}; env " if accepts else " (env ")[0]
        assert meaning.startswith(said), flag
    for command in COMMANDS & set(entries) - {"--help"}:
        assert "no environment variable" in entries[command][1]


def test_the_page_is_what_the_declarations_generate() -> None:
    assert settings_reference.PAGE.read_text() == settings_reference.page(), (
        "docs/reference/settings.md is stale: run python -m scripts.settings_reference"
    )


def test_the_check_mode_fails_on_a_stale_page(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stale = tmp_path / "settings.md"
    stale.write_text("# old\n")
    monkeypatch.setattr(settings_reference, "PAGE", stale)
    assert settings_reference.main(["--check"]) == 1
    assert settings_reference.main([]) == 0
    assert settings_reference.main(["--check"]) == 0
