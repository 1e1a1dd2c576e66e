"""Write docs/reference/settings.md from the services' settings declarations.

    python -m scripts.settings_reference           rewrite the page
    python -m scripts.settings_reference --check   exit 1 when the page is stale

A script rather than part of `shared`: it imports every service, which the shared library
may not (pyproject.toml's import contracts).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from shared.service.reference import settings_reference

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from shared.service.declare import SettingsParser

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "settings.md"
SERVICES = ("accounting", "refit", "scheduler", "deviceplugin")


def parsers(env: Mapping[str, str] | None = None) -> dict[str, SettingsParser]:
    """Each service's parser as `numafit run <service>` builds it (`env`: the environment it
    reads; the page is written with an empty one, so the defaults are the declared ones)."""
    from svc_accounting.__main__ import build_parser as accounting
    from svc_deviceplugin.__main__ import build_parser as deviceplugin
    from svc_refit.__main__ import build_parser as refit
    from svc_scheduler.__main__ import build_parser as scheduler

    builders = {
        "accounting": accounting,
        "refit": refit,
        "scheduler": scheduler,
        "deviceplugin": deviceplugin,
    }
    return {name: builders[name](f"numafit run {name}", env or {}) for name in SERVICES}


def page() -> str:
    return settings_reference(parsers())


def main(argv: Sequence[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m scripts.settings_reference")
    cli.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = cli.parse_args(argv)
    wanted = page()
    if args.check:
        if PAGE.read_text() != wanted:
            print(f"{PAGE} is stale: run python -m scripts.settings_reference", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
