"""Hand mutations of the commit boundary: the suite must catch each one, or this check fails.

Each mutant is applied to a temporary copy of the package (the real files are never edited),
then the tests most likely to notice run against that copy (``PYTHONPATH`` puts it first, and
the script checks that it is the copy that gets imported). A mutant that leaves those tests
green "survives": a promise that nothing protects. Exit status 0 means every mutant was killed.

Mutation points are found in the syntax tree, not by line number, so edits elsewhere in the
files do not move them. The anchors (keep them when you restructure, or update MUTANTS):

- _acceptance/judge.py, identity check: every statement that builds an error of type ``"identity"``
  (a call ``<name ending in error>("identity", ...)``, or with ``kind=``/``type=``
  ``"identity"``, or a dict literal ``{"type": "identity"}``); the innermost such statement
  is replaced by ``pass`` (``return []`` for a ``return``), so no identity mismatch is ever
  reported.
- _acceptance/judge.py, coverage check: the same for errors of type ``"coverage"`` (missing,
  duplicated and extra tasks are never reported).
- _session/accounts.py, the views: the method ``Evidence.requests`` (what is owed) and the
  property ``Evidence.superseded`` return an empty list.

An anchor that is no longer found fails the check with its name, rather than passing quietly.

Usage: ``python tools/mutants.py`` (from the repository root; ``make check`` runs it).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "batchjson"


class AnchorMissing(Exception):
    """A mutation point is not in the source any more: update MUTANTS (see the docstring)."""


def _builds_error(node: ast.AST, kind: str) -> bool:
    """``_error("kind", ...)``-style calls and ``{"type": "kind", ...}`` literals."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        given = [*node.args[:1], *(k.value for k in node.keywords if k.arg in ("kind", "type"))]
        return name.lower().endswith("error") and any(
            isinstance(arg, ast.Constant) and arg.value == kind for arg in given)
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "type"
                   and isinstance(v, ast.Constant) and v.value == kind
                   for k, v in zip(node.keys, node.values, strict=True))
    return False


class _Silence(ast.NodeTransformer):
    """Replace each innermost statement that builds a ``kind`` error by a no-op."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.hits = 0

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list):
                setattr(node, field, [self._mute(s) for s in stmts])
        return node

    def _mute(self, stmt: ast.AST) -> ast.AST:
        if not isinstance(stmt, ast.stmt) or _has_inner_stmt(stmt):
            return stmt
        if not any(_builds_error(n, self.kind) for n in ast.walk(stmt)):
            return stmt
        self.hits += 1
        if isinstance(stmt, ast.Return):
            return ast.copy_location(ast.Return(value=ast.List(elts=[], ctx=ast.Load())), stmt)
        return ast.copy_location(ast.Pass(), stmt)


def _has_inner_stmt(stmt: ast.AST) -> bool:
    return any(isinstance(child, ast.stmt) for field in ("body", "orelse", "finalbody",
                                                          "handlers")
               for child in getattr(stmt, field, []) or [])


def silence(kind: str) -> Callable[[ast.Module], int]:
    def apply(tree: ast.Module) -> int:
        walker = _Silence(kind)
        walker.visit(tree)
        return walker.hits
    return apply


def empty_member(cls: str, name: str) -> Callable[[ast.Module], int]:
    """``cls.name`` (method or property) returns ``[]``."""
    def apply(tree: ast.Module) -> int:
        hits = 0
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and \
                            item.name == name:
                        doc = item.body[:1] if ast.get_docstring(item) else []
                        item.body = [*doc, ast.Return(value=ast.List(elts=[], ctx=ast.Load()))]
                        hits += 1
        return hits
    return apply


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str  # path under src/batchjson
    apply: Callable[[ast.Module], int]
    tests: tuple[str, ...]  # run first (those that exist); the whole suite if none exists


ACCEPTANCE_TESTS = ("tests/test_seed_identity.py", "tests/test_identity_values.py",
                    "tests/test_acceptance_properties.py", "tests/test_session.py")
EVIDENCE_TESTS = ("tests/test_ratchet.py", "tests/test_shared_requests.py",
                  "tests/test_session.py", "tests/test_ledger.py")

MUTANTS = (
    Mutant("identity check removed", "_acceptance/judge.py", silence("identity"), ACCEPTANCE_TESTS),
    Mutant("coverage check removed", "_acceptance/judge.py", silence("coverage"), ACCEPTANCE_TESTS),
    Mutant("Evidence.requests returns nothing", "_session/accounts.py",
           empty_member("Evidence", "requests"), EVIDENCE_TESTS),
    Mutant("Evidence.superseded returns nothing", "_session/accounts.py",
           empty_member("Evidence", "superseded"), EVIDENCE_TESTS),
)


def mutate(copy: Path, mutant: Mutant) -> None:
    path = copy / "batchjson" / mutant.module
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if mutant.apply(tree) == 0:
        raise AnchorMissing(f"{mutant.name}: its mutation point is not in {mutant.module}; "
                            "update MUTANTS in tools/mutants.py (anchors in its docstring)")
    path.write_text(ast.unparse(ast.fix_missing_locations(tree)) + "\n", encoding="utf-8")


def fresh_copy(into: Path) -> Path:
    target = into / "batchjson"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return into


def env_for(copy: Path) -> dict[str, str]:
    path = os.pathsep.join([str(copy), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def check_copy_is_imported(copy: Path) -> None:
    out = subprocess.run([sys.executable, "-c", "import batchjson; print(batchjson.__file__)"],
                         env=env_for(copy), cwd=ROOT, capture_output=True, text=True, check=True)
    if not out.stdout.strip().startswith(str(copy)):
        raise SystemExit(f"mutants: the copy is not what gets imported ({out.stdout.strip()}); "
                         "is batchjson installed non-editable ahead of PYTHONPATH?")


def run_tests(copy: Path, tests: tuple[str, ...], *, show_failure: bool = False) -> int:
    chosen = [t for t in tests if (ROOT / t).exists()] or ["tests"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
           "-p", "no:randomly", *chosen]
    run = subprocess.run(cmd, env=env_for(copy), cwd=ROOT, capture_output=True, text=True)
    if show_failure and run.returncode != 0:  # the unmutated suite failing: say why
        print(run.stdout[-4000:], run.stderr[-2000:], sep="\n", file=sys.stderr)
    return run.returncode


def main() -> int:
    started = time.monotonic()
    survivors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="batchjson-mutants-") as tmp:
        copy = fresh_copy(Path(tmp))
        check_copy_is_imported(copy)
        baseline = tuple(dict.fromkeys(t for m in MUTANTS for t in m.tests))
        if run_tests(copy, baseline, show_failure=True) != 0:
            print("mutants: the unmutated tests fail; fix the suite first", file=sys.stderr)
            return 2
        for mutant in MUTANTS:
            fresh_copy(Path(tmp))
            try:
                mutate(copy, mutant)
            except AnchorMissing as exc:
                print(f"mutants: {exc}", file=sys.stderr)
                return 2
            code = run_tests(copy, mutant.tests)
            killed = code == 1  # tests ran and failed; 2+ would be a broken mutant or run
            print(f"  {'killed  ' if killed else 'SURVIVED'} {mutant.name}"
                  + ("" if code in (0, 1) else f" (pytest exit {code})"))
            if not killed:
                survivors.append(mutant.name)
    took = time.monotonic() - started
    if survivors:
        print(f"mutants: {len(survivors)} of {len(MUTANTS)} survived ({took:.0f}s): "
              f"{', '.join(survivors)}; add a test that fails on each", file=sys.stderr)
        return 1
    print(f"mutants: all {len(MUTANTS)} killed ({took:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
