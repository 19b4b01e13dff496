"""Fixtures for the IPython face: one real in-process shell, left as it was found."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def ip(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """IPython's test shell, in a fresh working directory, with batchjson not yet loaded."""
    pytest.importorskip("IPython")
    from IPython.testing import globalipapp

    from batchjson._ipython.state import ATTRIBUTE
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
            from batchjson._ipython import unload_ipython_extension

            unload_ipython_extension(shell)
        if state.session is not None:
            state.session.close()
        delattr(shell, ATTRIBUTE)
    shell.config.pop("BatchJson", None)
    shell.run_cell("%reset -f")
    session_module.set_default_session(previous_default)
