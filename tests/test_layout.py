"""The shape of the code holds: the ledger's SQL lives in its store, the ledger's parts never
reach for its facade, nothing outside the ledger reaches into its private names, and no module
of batchjson imports itself back through others (an import circle).

These read the source with ``ast``; nothing is imported, so a broken module fails elsewhere.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import batchjson

PACKAGE = Path(batchjson.__file__).parent
STORE_MODULES = re.compile(r"^_ledger/(store(_\w+)?|sqlite|postgres)\.py$")
SQL = re.compile(r"\b(SELECT\b.+\bFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|"
                 r"CREATE\s+(TABLE|INDEX|TRIGGER|VIEW)|DROP\s+(TABLE|INDEX)|ALTER\s+TABLE|"
                 r"PRAGMA\s+\w+|BEGIN\s+(IMMEDIATE|TRANSACTION)|ON\s+CONFLICT)", re.S)


def modules() -> Iterator[tuple[str, Path, ast.Module]]:
    """(path relative to the package, file, parsed module) of every module of batchjson."""
    for file in sorted(PACKAGE.rglob("*.py")):
        yield file.relative_to(PACKAGE).as_posix(), file, ast.parse(file.read_text())


def sql_in(tree: ast.Module) -> list[tuple[int, str]]:
    return [(node.lineno, match.group(0)[:60]) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and (match := SQL.search(node.value))]


def test_sql_statements_appear_only_in_the_store():
    found = {name: sql_in(tree) for name, _, tree in modules()}
    outside = {name: hits for name, hits in found.items()
               if hits and not STORE_MODULES.match(name)}
    assert outside == {}, ("SQL outside the store (_ledger/store*.py, _ledger/sqlite.py, "
                           f"_ledger/postgres.py): {outside}")
    assert len(found["_ledger/store_calls.py"]) > 5  # the scan does see SQL where it is


def test_only_the_postgresql_store_uses_psycopg():
    users = {name for name, _, tree in modules() for node in ast.walk(tree)
             if (isinstance(node, ast.Import) and any(a.name.startswith("psycopg")
                                                      for a in node.names))
             or (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("psycopg"))}
    assert users == {"_ledger/postgres.py"}


def test_only_the_sqlite_store_uses_sqlite3():
    users = {name for name, _, tree in modules() for node in ast.walk(tree)
             if isinstance(node, ast.Import) and any(a.name == "sqlite3" for a in node.names)}
    assert users == {"_ledger/sqlite.py"}


def test_no_module_outside_the_ledger_reaches_into_a_private_name_of_the_ledger_or_its_store():
    reached = []
    for name, _, tree in modules():
        if name.startswith("_ledger/"):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and re.search(r"ledger|store", ast.unparse(node.value), re.I)):
                reached.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert reached == []


def test_the_parts_of_the_ledger_import_the_store_never_the_facade():
    facade = []
    for name, _, tree in modules():
        if not name.startswith("_ledger/") or name in ("_ledger/__init__.py",
                                                        "_ledger/ledger.py"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (
                    node.module in ("ledger", "batchjson._ledger.ledger")
                    or (node.module in (None, "") and any(a.name == "ledger"
                                                          for a in node.names))
                    or any(a.name == "Ledger" for a in node.names)):
                facade.append(f"{name}:{node.lineno}")
    assert facade == []


def _imports(module: str, is_package: bool, tree: ast.Module, known: set[str]) -> set[str]:
    """The batchjson modules ``module`` imports when it runs (anywhere in it: a function's
    import closes a circle too; ``if TYPE_CHECKING:`` blocks never run)."""
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and ast.unparse(node.test).endswith("TYPE_CHECKING")
               for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[:len(module.split(".")) - node.level + is_package]
                base = ".".join(parts + ([node.module] if node.module else []))
            named = {f"{base}.{a.name}" for a in node.names} & known
            missing = {f"missing: {base}"} if base.startswith("batchjson") else set()
            out |= named or ({base} & known) or missing
    return out - {module}


def import_graph() -> dict[str, set[str]]:
    names = {}
    for name, _, tree in modules():
        parts = ["batchjson", *name.removesuffix(".py").split("/")]
        package = parts[-1] == "__init__"
        names[".".join(parts[:-1] if package else parts)] = (package, tree)
    known = set(names)
    return {m: _imports(m, package, tree, known) for m, (package, tree) in names.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_batchjson_imports_itself_back_through_others():
    graph = import_graph()
    assert "batchjson._ledger.store" in graph["batchjson._ledger.accounts"]  # edges are seen
    missing = {m: sorted(d for d in deps if d.startswith("missing: "))
               for m, deps in graph.items() if any(d.startswith("missing: ") for d in deps)}
    assert missing == {}  # an import of a module that is not there (moved, deleted)
    assert circles(graph) == []


def test_an_import_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
