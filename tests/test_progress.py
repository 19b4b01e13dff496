"""Progress counts every task of the batch: resumed work is part of the total, as tqdm users
expect (2000/2000 at the end, never 1980/1980)."""

from __future__ import annotations

from batchjson import CallableProvider, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks


class Bar:
    made: list[Bar] = []

    def __init__(self, total: int, name: str) -> None:
        self.total, self.n = total, 0
        Bar.made.append(self)

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        pass


def test_a_resumed_batch_counts_its_resumed_tasks_in_the_total_and_the_count():
    session = Session(CallableProvider(items_reply, source="m"))
    session.run_batch("r", review_tasks(6), LABEL_SCHEMA, pack=2)
    result = session.run_batch("r", review_tasks(8), LABEL_SCHEMA, pack=2, progress=Bar)
    bar = Bar.made[-1]
    assert result.resumed == 3 and result.calls == 1
    assert (bar.n, bar.total) == (8, 8)
    session.close()


def test_the_text_bar_starts_at_the_resumed_tasks(capsys):
    session = Session(CallableProvider(items_reply, source="m"))
    session.run_batch("r", review_tasks(6), LABEL_SCHEMA, pack=2)
    capsys.readouterr()
    session.run_batch("r", review_tasks(8), LABEL_SCHEMA, pack=2, progress=True)
    assert "8/8" in capsys.readouterr().err
    session.close()
