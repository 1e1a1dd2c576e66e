""".dockerignore keeps the build context to what the Dockerfile copies: everything it COPYs is
sent, the virtualenv, .git, the tests, caches and build artefacts are not.

Docker's matching is reproduced here (moby's patternmatcher: patterns in order, the last one
that matches a path or one of its parent directories decides, `!` re-includes), so the test
needs no Docker engine."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERIGNORE = ROOT / ".dockerignore"
DOCKERFILE = ROOT / "Dockerfile"


def _regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def rules() -> list[tuple[bool, re.Pattern[str]]]:
    """(exclusion, pattern) in file order, as Docker reads them."""
    found = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        found.append((exclusion, _regex(pattern)))
    return found


def ignored(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Is `path` (relative, with /) left out of the build context?"""
    parts = path.split("/")
    candidates = [path] + ["/".join(parts[: i + 1]) for i in range(len(parts) - 1)]
    matched = False
    for exclusion, pattern in patterns:
        if exclusion != matched:
            continue
        if any(pattern.match(c) for c in candidates):
            matched = not exclusion
    return matched


def context_files() -> list[str]:
    """Every file of the checkout Docker would send."""
    patterns = rules()
    sent = []
    for directory, dirs, files in os.walk(ROOT):
        rel = Path(directory).relative_to(ROOT).as_posix()
        prefix = "" if rel == "." else rel + "/"
        # Docker also walks into excluded directories when a later `!` might re-include;
        # nothing here is re-included below a directory that is itself excluded.
        dirs[:] = [d for d in dirs if not ignored(prefix + d, patterns)]
        sent += [prefix + f for f in files if not ignored(prefix + f, patterns)]
    return sent


def copied_sources() -> list[str]:
    """What the Dockerfile COPYs from the build context (not from another stage)."""
    sources = []
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += words[1:-1]
    return sources


def test_the_matcher_reads_docker_patterns_as_docker_does() -> None:
    patterns = [(False, _regex("*")), (True, _regex("src")), (False, _regex("**/*.pyc"))]
    assert ignored(".venv/bin/python", patterns)
    assert not ignored("src/a.py", patterns)
    assert ignored("src/sub/a.pyc", patterns)
    assert ignored("README.md", patterns)


def test_everything_the_dockerfile_copies_is_sent() -> None:
    sent = set(context_files())
    sources = copied_sources()
    assert {"pyproject.toml", "README.md", "shared", "proto"} <= set(sources)
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"the Dockerfile copies {source}, which does not exist"
        if path.is_file():
            assert source in sent, f"{source} is copied but ignored"
            continue
        wanted = [
            p.relative_to(ROOT).as_posix()
            for p in path.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
        assert wanted, source
        missing = [w for w in wanted if w not in sent]
        assert missing == [], f"{source}: ignored but needed: {missing[:5]}"


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        ".pytest_cache/README.md",
        ".mypy_cache/3.11/x.json",
        ".ruff_cache/x",
        ".hypothesis/examples/x",
        "numafit.egg-info/PKG-INFO",
        "shared/__pycache__/cli.cpython-311.pyc",
        "svc_refit/service.pyc",
        "helm/numafit/Chart.yaml",
        "build/lib/x.py",
        "dist/numafit-0.1.0.whl",
    ],
)
def test_what_the_image_does_not_need_stays_out(path: str) -> None:
    assert ignored(path, rules())


def test_the_context_is_small() -> None:
    size = sum((ROOT / f).stat().st_size for f in context_files())
    assert size < 20 * 1024 * 1024, f"build context of {size} bytes"
    assert not any(f.startswith((".venv/", ".git/", "tests/")) for f in context_files())
