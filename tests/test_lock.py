"""The lock (requirements/lock.txt) pins every dependency pyproject.toml declares.

``make build`` installs the lock and then the package without its dependencies,
so a requirement added to pyproject without `make lock` would go missing, and a
range the pin no longer satisfies would install a version the project rejects.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "lock.txt"


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines += extra
    return [r for r in map(Requirement, lines) if canonicalize_name(r.name) != "recstore"]


@pytest.mark.parametrize("requirement", _declared(), ids=str)
def test_every_declared_dependency_is_pinned_within_its_range(requirement: Requirement) -> None:
    pins = _pins()
    name = canonicalize_name(requirement.name)
    assert name in pins, f"{requirement} is not in {LOCK.name}: run make lock"
    assert requirement.specifier.contains(pins[name], prereleases=True), (
        f"{LOCK.name} pins {name}=={pins[name]}, outside {requirement}: run make lock"
    )


def test_every_line_is_a_pinned_release_not_a_path() -> None:
    # `name @ file:///...` (the project itself, reached through its own extras) would
    # install whatever checkout resolved the lock, or fail on any other machine.
    for line in LOCK.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement:
            assert "==" in requirement and "@" not in requirement, line


def test_the_generator_of_the_committed_code_is_the_locked_one() -> None:
    from recstore.v1 import ps_pb2_grpc

    assert _pins()["grpcio-tools"] == ps_pb2_grpc.GRPC_GENERATED_VERSION


def test_the_installed_environment_is_the_lock() -> None:
    from importlib.metadata import version

    for name in ("torch", "grpcio", "grpcio-tools", "protobuf", "numpy"):
        assert version(name) == _pins()[name], name
