"""Layering rules import-linter cannot check: the namespace portion recstore.operator.

The operator may import the core, the store facade and the wire contract, never
another service or the SDK; and nothing may import ``recstore.operator`` except
its own modules and the CLI entry point.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_FOR_OPERATOR = ("recstore.admin", "recstore.ps", "recstore.client", "recstore.local")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


OPERATOR_MODULES = sorted((ROOT / "operator").glob("*.py"))


def test_operator_is_a_namespace_portion() -> None:
    assert OPERATOR_MODULES, "operator/ has no modules"
    assert not (ROOT / "operator" / "__init__.py").exists()


@pytest.mark.parametrize("path", OPERATOR_MODULES, ids=lambda p: p.name)
def test_operator_imports_no_other_component(path: Path) -> None:
    bad = {
        name
        for name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN_FOR_OPERATOR)
    }
    assert not bad, f"{path.name} imports {sorted(bad)}"


OTHER_COMPONENTS = [
    p
    for folder in ("admin_api", "ps_node", "client_sdk", "src/recstore/core", "src/recstore/local")
    for p in sorted((ROOT / folder).rglob("*.py"))
    if "migrations" not in p.parts
]


@pytest.mark.parametrize("path", OTHER_COMPONENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_else_imports_the_operator(path: Path) -> None:
    assert not {n for n in _imports(path) if n.startswith("recstore.operator")}


CORE_MODULES = sorted((ROOT / "src/recstore/core").glob("*.py"))


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: p.name)
def test_core_stays_free_of_torch_and_kopf(path: Path) -> None:
    # Services import the core; torch or kopf there would weigh on every one of them.
    heavy = {n for n in _imports(path) if n.split(".")[0] in {"torch", "kopf", "fastapi"}}
    assert not heavy, f"{path.name} imports {sorted(heavy)}"
