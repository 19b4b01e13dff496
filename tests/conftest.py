"""Fixtures: one real in-process IPython shell, left as it was found; and the ledger contract's
two stores, a SQLite file and a database on a real PostgreSQL server the tests start."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_databases = itertools.count()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """One PostgreSQL server for the whole run (started on first use, about half a second)."""
    from tests.postgres_server import start_postgres

    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    """Where a test keeps its ledgers, once per store: ``ledger_at("a")`` is the file
    ``a.sqlite`` in the test's directory, or the URL of a new database of its own; the same
    name gives the same ledger."""
    if request.param == "sqlite":
        return lambda name="l": tmp_path / f"{name}.sqlite"
    server = request.getfixturevalue("postgres")
    made: dict[str, str] = {}

    def at(name: str = "l") -> str:
        if name not in made:
            made[name] = server.database(f"{name.lower()}_{next(_databases)}")
        return made[name]

    return at


@pytest.fixture
def ip(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """IPython's test shell, in a fresh working directory, with batchjson not yet loaded."""
    pytest.importorskip("IPython")
    from IPython.testing import globalipapp

    from batchjson._ipython.magics import ATTRIBUTE
    from batchjson._session import session as session_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BATCHJSON_PROVIDER", raising=False)
    globalipapp.start_ipython()  # once per process; later calls return None
    shell = globalipapp.get_ipython()
    previous_default = session_module._default
    shell.run_cell("%reset -f")
    yield shell
    if "batchjson" in shell.extension_manager.loaded:
        shell.extension_manager.unload_extension("batchjson")
    state = getattr(shell, ATTRIBUTE, None)
    if state is not None:
        if state.magics is not None:  # loaded by calling the hook directly, not %load_ext
            from batchjson._ipython.magics import unload_ipython_extension

            unload_ipython_extension(shell)
        if state.session is not None:
            state.session.close()
        delattr(shell, ATTRIBUTE)
    shell.config.pop("BatchJson", None)
    shell.run_cell("%reset -f")
    session_module.set_default_session(previous_default)
