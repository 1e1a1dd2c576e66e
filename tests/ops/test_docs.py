"""The documentation site stays whole without building it: every page under docs/ is in
mkdocs.yml's nav and every nav entry exists, every relative link in README.md and docs/ lands
on a file (and, into a page, on one of its headings), and every metric a service exports is
in the metrics reference. `make docs` (mkdocs --strict) checks the rest; this needs no mkdocs."""

from __future__ import annotations

import inspect
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml

import svc_accounting.metrics
import svc_deviceplugin.metrics
import svc_refit.metrics
import svc_scheduler.metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def nav_pages(entries: list[Any]) -> list[str]:
    """Every page a nav (a list of `title: page` or `title: [entries]`) names."""
    pages: list[str] = []
    for entry in entries:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    return loaded


def prose(text: str) -> str:
    """The text without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading (its default slugify, on the heading's
    text without inline markup)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        name, n = base, 0
        while name in found:  # toc numbers a repeated heading's anchor
            n += 1
            name = f"{base}_{n}"
        found.add(name)
    return found


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    nav = nav_pages(config()["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(nav) == pages, "mkdocs.yml's nav and the pages under docs/ differ"
    assert len(nav) == len(set(nav)), "a page is in the nav twice"


def test_the_site_builds_strictly_into_an_ignored_folder() -> None:
    cfg = config()
    assert cfg["docs_dir"] == "docs" and cfg["strict"] is True
    assert f"{cfg['site_dir']}/" in (ROOT / ".gitignore").read_text().split()
    assert "mkdocs build --strict" in (ROOT / "Makefile").read_text()
    assert "make docs" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
        elif page != README and DOCS not in dest.parents and dest != DOCS:
            # The site holds docs/ only: a link out of it would break there.
            broken.append(f"{target}: outside docs/ (name the file in code instead)")
    assert broken == []


REPO_PATH = re.compile(
    r"`((?:shared|svc_[a-z]+|tests|helm|deploy|examples|scripts|proto|docs)/[\w./-]*)`"
)


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_file_the_docs_name_exists(page: Path) -> None:
    """A path in code (`shared/core/fit.py`, `helm/README.md`) names a file of the repository:
    a file moved or renamed is a page to update. A paragraph that says what is gone (a page
    telling why a module was removed) may name it."""
    paragraphs = re.split(r"\n\s*\n", FENCE.sub("", page.read_text()))
    current = [p for p in paragraphs if not re.search(r"\b(gone|removed|deleted)\b", p)]
    named = {path for p in current for path in REPO_PATH.findall(p)}
    missing = sorted(path for path in named if not (ROOT / path.rstrip("/")).exists())
    assert missing == [], f"{page.name} names files that are gone: update the page's text"


def exported_metrics() -> set[str]:
    """Every metric name the four services register, with `_total` for counters, as
    Prometheus shows them."""
    names: set[str] = set()
    for module in (
        svc_scheduler.metrics,
        svc_refit.metrics,
        svc_accounting.metrics,
        svc_deviceplugin.metrics,
    ):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or not cls.__name__.endswith("Metrics"):
                continue
            instance: Any = cls()  # each class builds its metrics on a registry of its own
            for metric in instance.registry.collect():
                names.add(metric.name + ("_total" if metric.type == "counter" else ""))
    return names


def test_every_exported_metric_is_in_the_metrics_reference() -> None:
    exported = exported_metrics()
    assert len(exported) >= 50
    documented = set(
        re.findall(r"`(numafit_[a-z0-9_]+)", (DOCS / "reference" / "metrics.md").read_text())
    )
    assert exported - documented == set(), "metrics exported but not in docs/reference/metrics.md"
    # Others (sim-node's) are registered outside the services' metrics classes: their name
    # must at least be in the product's source.
    source = "\n".join(
        p.read_text()
        for package in (
            "shared",
            "svc_scheduler",
            "svc_refit",
            "svc_accounting",
            "svc_deviceplugin",
        )
        for p in (ROOT / package).rglob("*.py")
    )
    unknown = {
        name for name in documented - exported if f'"{name.removesuffix("_total")}"' not in source
    }
    assert unknown == set(), "docs/reference/metrics.md names metrics nobody exports"
