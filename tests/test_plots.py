"""Pictures and the advice's uncertainty: a recommendation only beyond the returns' spread, the
same advice every time, charts as PNG from a result, the command line and (without matplotlib)
one line saying how to get them."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from batchjson import ConfigError, FaultPlan, Session, SimulatedModel
from batchjson._textview import advice_lines

PNG = b"\x89PNG\r\n\x1a\n"
SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string",
                                                       "enum": ["match", "no_match"]}},
          "required": ["verdict"]}
INSTRUCTIONS = "You review candidate entity matches against their gold case. " * 30


def tasks(n: int) -> list[dict]:
    return [{"task_id": f"t{i:03d}", "prompt": f"Is candidate {i} a match?"} for i in range(n)]


def ran(rate: float, n: int, pack: int, *, ledger: str = ":memory:") -> Session:
    """A batch on the offline model priced like gpt-4o-mini, with per-item faults."""
    model = SimulatedModel(answer=lambda task: {"verdict": "match"}, seed=1,
                           faults=FaultPlan(item_wrong_type=rate), model="gpt-4o-mini",
                           price_per_million=(0.15, 0.60))
    session = Session(model, ledger=ledger)
    session.run_batch("review", tasks(n), SCHEMA, pack=pack, instructions=INSTRUCTIONS,
                      on_exhausted="return")
    return session


def test_no_other_pack_is_recommended_when_its_interval_overlaps_the_current_packs() -> None:
    advice = ran(0.05, 60, 5).advise("review", modes=["whole", "split"])  # a dozen noisy returns
    cheapest, current = advice["cheapest"], advice["current"]
    assert cheapest["pack"] != advice["current_pack"] == 5  # the point estimate says move
    assert cheapest["interval"][1] >= current["interval"][0]  # but not beyond the spread
    assert advice["recommended"] == current
    assert advice["verdict"].startswith("the current pack 5 is as good as the data can tell")


def test_a_pack_whose_interval_lies_wholly_below_the_current_packs_is_recommended() -> None:
    advice = ran(0.0, 60, 2).advise("review")  # shared instructions paid 30 times over
    best, current = advice["recommended"], advice["current"]
    assert best["pack"] > 2 and best["interval"][1] < current["interval"][0]
    assert advice["verdict"].startswith(f"pack {best['pack']}")
    assert "is cheaper per usable result than the current pack 2, beyond" in advice["verdict"]


def test_the_bootstrap_is_seeded_so_the_same_ledger_gives_the_same_advice() -> None:
    session = ran(0.05, 60, 5)
    first, second = session.advise("review"), session.advise("review")
    assert first == second and advice_lines(first) == advice_lines(second)
    assert first["resamples"] == 200 and all(c["interval"] for c in first["candidates"])


def test_the_advice_text_shows_a_few_candidates_each_with_its_mode_and_interval() -> None:
    advice = ran(0.05, 60, 5).advise("review")
    lines = advice_lines(advice)
    rows = [line for line in lines if line.split()[:1] and line.split()[0].isdigit()]
    assert len(advice["candidates"]) == 45 and 3 <= len(rows) <= 8  # 15 sizes, 3 modes each
    assert all(" - $" in row and row.split()[1] in ("whole", "split", "items") for row in rows)
    assert any(row.endswith("current") for row in rows)
    assert any(row.endswith("cheapest, recommended") for row in rows)
    assert "other candidate(s)" in "\n".join(lines)
    [at_current] = [line for line in lines if line.startswith("  at pack 5,")]
    assert all(f"{mode} $" in at_current for mode in ("whole", "split", "items"))


def test_result_plot_returns_a_png_chart_and_writes_it_to_a_path(tmp_path: Path) -> None:
    result = ran(0.05, 30, 5).run_batch("review", tasks(30), SCHEMA, pack=5,
                                        instructions=INSTRUCTIONS, on_exhausted="return")
    chart = result.plot()
    assert chart.png.startswith(PNG) and chart._repr_png_() == chart.png
    assert "spend and accepted results" in repr(chart)
    assert result.plot(tmp_path / "spend.png").png == (tmp_path / "spend.png").read_bytes()


def test_advise_plot_writes_a_png_beside_the_text(tmp_path: Path) -> None:
    ran(0.05, 30, 5, ledger=str(tmp_path / "ledger.sqlite")).close()
    done = subprocess.run([sys.executable, "-m", "batchjson", "advise", "review", "--ledger",
                           "ledger.sqlite", "--plot", "advice.png"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "advice.png").read_bytes().startswith(PNG)
    assert "pack-size advice for batch 'review'" in done.stdout
    assert done.stdout.strip().endswith("chart written to advice.png")


def test_without_matplotlib_one_line_says_how_to_get_the_chart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    session = ran(0.05, 30, 5, ledger=str(tmp_path / "ledger.sqlite"))
    result = session.run_batch("review", tasks(30), SCHEMA, pack=5, instructions=INSTRUCTIONS,
                               on_exhausted="return")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ConfigError, match=r"^install batchjson\[plots\] \(matplotlib\) to see "
                                          r"the chart$"):
        result.plot()
    session.close()
    from batchjson._cli import main

    out = io.StringIO()
    capsys.readouterr()
    code = main(["advise", "review", "--ledger", str(tmp_path / "ledger.sqlite"), "--plot",
                 str(tmp_path / "advice.png")], out=out)
    assert code == 2 and not (tmp_path / "advice.png").exists()
    assert "pack-size advice" in out.getvalue()  # the advice itself is still said
    [said] = capsys.readouterr().err.splitlines()
    assert "install batchjson[plots] (matplotlib) to see the chart" in said
