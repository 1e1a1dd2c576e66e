"""The image is built from lock files kept in the repository, and they agree with pyproject.toml:
every runtime dependency (and every build requirement) is pinned to one version its specifier
allows, with hashes. Offline: nothing here asks an index, so CI catches a pyproject change
that the lock did not follow (regenerate it with the command in its header)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"
BUILD_LOCK = ROOT / "requirements-build.lock"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def read_lock(text: str) -> dict[str, tuple[Version, list[str]]]:
    """name (normalised) -> (pinned version, sha256 hashes); anything that is not an exact pin
    with hashes fails."""
    pins: dict[str, tuple[Version, list[str]]] = {}
    logical = re.sub(r"\\\n", " ", text)  # continuation lines
    for raw in logical.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
        spec = re.sub(r"--hash=\S+", "", line).strip()
        assert not spec.startswith("-"), f"an option in the lock: {spec!r}"
        requirement = Requirement(spec)
        (pin,) = requirement.specifier  # exactly one specifier ...
        assert pin.operator == "==" and "*" not in pin.version, f"not pinned: {spec!r}"
        assert hashes, f"{requirement.name} has no hash"
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"{name} pinned twice"
        pins[name] = (Version(pin.version), hashes)
    return pins


def test_the_reader_refuses_what_pip_would_not_install_by_hash() -> None:
    digest = "0" * 64
    assert read_lock(f"Foo_Bar==1.2 \\\n    --hash=sha256:{digest}\n    # via x\n") == {
        "foo-bar": (Version("1.2"), [digest])
    }
    for bad in (f"foo>=1 --hash=sha256:{digest}", "foo==1", f"foo==1.* --hash=sha256:{digest}"):
        with pytest.raises(AssertionError):
            read_lock(bad)


def unmet(requirements: list[str], pins: dict[str, tuple[Version, list[str]]]) -> list[str]:
    """The requirements the pins do not satisfy (missing, or a version outside the
    specifier)."""
    problems = []
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name not in pins:
            problems.append(f"{requirement.name} is not in the lock")
        elif not requirement.specifier.contains(pins[name][0], prereleases=True):
            problems.append(f"{requirement} is not met by {name}=={pins[name][0]}")
    return problems


def test_unmet_finds_missing_and_outdated_pins() -> None:
    pins = {"nats-py": (Version("2.15"), ["0" * 64])}
    assert unmet(["nats_py>=2.16", "pyyaml"], pins) == [
        "nats_py>=2.16 is not met by nats-py==2.15",
        "pyyaml is not in the lock",
    ]
    assert unmet(["NATS.py>=2,<3"], pins) == []


def test_the_lock_pins_every_runtime_dependency_of_pyproject() -> None:
    dependencies = PYPROJECT["project"]["dependencies"]
    assert dependencies
    assert unmet(dependencies, read_lock(LOCK.read_text())) == []


def test_the_build_lock_pins_every_build_requirement() -> None:
    requirements = PYPROJECT["build-system"]["requires"]
    pins = read_lock(BUILD_LOCK.read_text())
    assert unmet(requirements, pins) == []
    # The build tools stay out of the runtime lock (the runtime venv has no setuptools).
    assert not {"setuptools", "wheel", "pip"} & set(read_lock(LOCK.read_text()))


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions (keyword, arguments), comments dropped, continued lines
    joined."""
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, arguments = line.strip().partition(" ")
            found.append((keyword.upper(), " ".join(arguments.split())))
    return found


def run_commands() -> list[str]:
    """Every command the RUN instructions chain with &&."""
    return [c.strip() for k, a in instructions() if k == "RUN" for c in a.split("&&")]


def test_the_dockerfile_installs_only_from_the_locks() -> None:
    assert ("COPY", "requirements-build.lock requirements.lock ./") in instructions()
    commands = run_commands()
    assert not [c for c in commands if "--upgrade pip" in c or "-U pip" in c]
    installs = [c for c in commands if re.search(r"\bpip (--python \S+ )?(install|wheel)\b", c)]
    assert len(installs) == 4, installs
    for install in installs:
        # From a lock, by hash; numafit's own wheel; or installed from those wheels, no index.
        by_hash = "--require-hashes" in install and re.search(
            r"-r requirements(-build)?\.lock$", install
        )
        own = "--no-deps" in install and install.endswith(" .")
        offline = "--no-index --find-links /wheels" in install
        assert by_hash or own or offline, f"an install that bypasses the locks: {install}"
        # Nothing unpinned fetched to build a package: wheels only, or the locked build tools.
        assert "--only-binary=:all:" in install or "--no-build-isolation" in install or offline
    # The runtime virtualenv never gets pip or setuptools, and the base image's are removed.
    assert "python -m venv --without-pip /opt/numafit" in commands
    assert "python -m pip uninstall --yes --quiet pip setuptools wheel" in commands


def test_the_runtime_user_is_a_plain_user_with_a_home() -> None:
    (useradd,) = [c for c in run_commands() if c.startswith("useradd ")]
    assert "--uid 10001" in useradd
    assert "--system" not in useradd  # 10001 is above the system range: useradd warns
    assert "--create-home" in useradd and "--home-dir /home/numafit" in useradd
    assert ("USER", "10001") in instructions()
