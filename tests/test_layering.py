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


CORE_MODULES = sorted((ROOT / "src/recstore/core").rglob("*.py"))


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: p.name)
def test_core_stays_free_of_torch_and_kopf(path: Path) -> None:
    # Services import the core; torch or kopf there would weigh on every one of them.
    heavy = {n for n in _imports(path) if n.split(".")[0] in {"torch", "kopf", "fastapi"}}
    assert not heavy, f"{path.name} imports {sorted(heavy)}"


# Where each part of the one package lives in the checkout (src/recstore links to the rest).
PACKAGE_FOLDERS = {
    "recstore.client": ROOT / "client_sdk",
    "recstore.ps": ROOT / "ps_node",
    "recstore.admin": ROOT / "admin_api",
    "recstore.operator": ROOT / "operator",
    "recstore.core": ROOT / "src/recstore/core",
    "recstore.store": ROOT / "src/recstore/store",
    "recstore.local": ROOT / "src/recstore/local",
    "recstore.cli": ROOT / "src/recstore/cli",
}


def _module_files() -> dict[str, Path]:
    """Every product module that does work (package ``__init__`` surfaces left out)."""
    modules = {}
    for package, folder in PACKAGE_FOLDERS.items():
        for path in folder.rglob("*.py"):
            if "migrations" in path.parts or path.name == "__init__.py":
                continue
            relative = path.relative_to(folder).with_suffix("").parts
            modules[".".join((package, *relative))] = path
    return modules


def _module_imports(path: Path, known: set[str]) -> set[str]:
    """The known modules ``path`` imports, ``if TYPE_CHECKING`` imports included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in known:
                found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found & known


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return groups


@pytest.mark.parametrize(
    ("graph", "cycles"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ],
)
def test_import_cycles_are_found(graph: dict[str, set[str]], cycles: list[list[str]]) -> None:
    assert import_cycles(graph) == cycles


def test_no_module_imports_itself_back() -> None:
    # A circle means neither module can be read, tested or moved without the other.
    files = _module_files()
    graph = {name: _module_imports(path, set(files)) for name, path in files.items()}
    assert import_cycles(graph) == []
