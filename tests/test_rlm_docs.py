"""The droste and rlm snippets of docs/rlm.md run as written, imports included.

Each engine's own OpenAI-compatible client reads ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``;
here they point at a scripted endpoint on loopback whose root model writes the seed's cell (an
inline validator, raising while prompts fail) and whose subcalls fail the validator at first.
The offline rlm snippet needs neither: it starts its own root model and the loopback server.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import MockOpenAI, flaky_labels, labelling_cell

DOCS = Path(__file__).resolve().parent.parent / "docs" / "rlm.md"

# rlm hands the cell a list, droste a text
CELL = labelling_cell("context if isinstance(context, list) else context.splitlines()")


def snippet(heading: str) -> str:
    """The first python block under ``heading`` in docs/rlm.md."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)\n```", section, re.DOTALL).group(1)


def run_snippet(code: str, server: MockOpenAI, monkeypatch: pytest.MonkeyPatch,
                tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-mock")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(DOCS), "exec"), {"__name__": "docs_rlm"})


def test_the_droste_snippet_runs_as_written_and_reaches_ready(monkeypatch, tmp_path, capsys):
    pytest.importorskip("droste")
    code = snippet("## droste: `droste_environment`")
    assert "import droste" in code and "droste_environment(" in code
    with MockOpenAI(f"```python\n{CELL}\n```", flaky_labels(bad=12)) as server:
        run_snippet(code, server, monkeypatch, tmp_path)
    assert capsys.readouterr().out.strip() == "True pos,pos,pos"
    assert len(server.roots) >= 2  # the cell failed at least once and was re-run


def test_the_rlm_snippet_runs_as_written_and_reaches_ready(monkeypatch, tmp_path, capsys):
    pytest.importorskip("rlm", reason="the rlms package is not installed")
    code = snippet("## alexzhang13/rlm: `rlm_hooks`")
    assert "from rlm import RLM" in code and "rlm_hooks(" in code
    with MockOpenAI(f"```repl\n{CELL}\n```", flaky_labels(bad=12)) as server:
        run_snippet(code, server, monkeypatch, tmp_path)
    assert capsys.readouterr().out.strip() == "pos,pos,pos"  # nothing left unresolved
    assert len(server.roots) == 2
    assert (tmp_path / "reviews-ledger.sqlite").exists()


def test_the_offline_rlm_snippet_runs_as_pasted_with_no_key_and_no_network(monkeypatch, tmp_path,
                                                                          capsys):
    pytest.importorskip("rlm", reason="the rlms package is not installed")
    code = snippet("### Trying it offline")
    assert "LoopbackServer(" in code and "rlm_hooks(" in code and "RLM(" in code
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(DOCS), "exec"), {"__name__": "docs_rlm_offline"})
    answer, asked = capsys.readouterr().out.strip().splitlines()
    assert answer == "pos,neg,pos"  # ready: every review labelled, nothing owed
    assert int(asked.split()[0]) > 3  # broken JSON was caught and repaired through rlm's client
    assert (tmp_path / "reviews-ledger.sqlite").exists()
