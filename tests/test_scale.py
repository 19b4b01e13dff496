"""Batches too big to hold several times: tasks streamed from a generator or a JSON Lines file,
values read back from the ledger when asked for, memory bounded at hundreds of thousands of
tasks (the figures themselves live in benchmarks/bench_scale.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from batchjson import CallableProvider, ConfigError, InvalidBatch, Session
from batchjson._session import result as values_module
from tests.helpers import LABEL_SCHEMA, answer, items_reply, review_tasks

ROOT = Path(__file__).resolve().parents[1]


def labeller():
    return CallableProvider(items_reply)


def write_jsonl(path: Path, tasks: list[dict]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")
    return path


def test_tasks_from_a_generator_or_a_jsonl_file_resolve_as_a_list_does(tmp_path):
    tasks = review_tasks(30)
    listed = Session(labeller()).run_batch("b", tasks, LABEL_SCHEMA, pack=4)
    session = Session(labeller(), ledger=tmp_path / "l.sqlite")
    generated = session.run_batch("b", (dict(t) for t in tasks), LABEL_SCHEMA, pack=4)
    from_file = session.run_batch("b", write_jsonl(tmp_path / "t.jsonl", tasks), LABEL_SCHEMA,
                                  pack=4)
    assert dict(generated.values) == dict(listed.values) == {
        t["task_id"]: answer(t) for t in tasks}
    assert from_file.calls == 0 and from_file.revision == generated.revision  # same content
    as_text = session.run_batch("b", str(tmp_path / "t.jsonl"), LABEL_SCHEMA, pack=4)
    assert as_text.calls == 0 and as_text.status == "resolved"


def test_a_bad_line_of_a_tasks_file_is_refused_by_its_number_before_any_call(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(review_tasks(1)[0]) + "\n\n{not json\n", encoding="utf-8")
    calls = []
    session = Session(CallableProvider(lambda call: calls.append(call) or items_reply(call)))
    with pytest.raises(InvalidBatch, match="line 3 of the tasks file .*is not JSON"):
        session.run_batch("b", path, LABEL_SCHEMA)
    with pytest.raises(InvalidBatch, match="cannot be read"):
        session.run_batch("b", tmp_path / "missing.jsonl", LABEL_SCHEMA)
    assert calls == [] and session.ledger.batch_names() == []


def test_a_bad_task_in_a_tasks_file_is_named_by_its_line_as_well_as_its_place(tmp_path):
    """Blank lines are no tasks, so a task's place is not its line: an error names both."""
    path = tmp_path / "t.jsonl"
    good = [json.dumps(t) for t in review_tasks(2)]
    path.write_text(f"{good[0]}\n\n\n{good[1]}\n" + '{"prompt": "no id"}\n', encoding="utf-8")
    calls = []
    session = Session(CallableProvider(lambda call: calls.append(call) or items_reply(call)))
    with pytest.raises(InvalidBatch, match=r"task #2 has no task_id; .* \(line 5 of the tasks "
                                           r"file '.*t\.jsonl'\)"):
        session.run_batch("b", path, LABEL_SCHEMA)
    with pytest.raises(InvalidBatch) as listed:  # the same tasks from a list: no line to name
        session.run_batch("b", [*review_tasks(2), {"prompt": "no id"}], LABEL_SCHEMA)
    assert "task #2 has no task_id" in str(listed.value) and "line" not in str(listed.value)
    assert calls == [] and session.ledger.batch_names() == []


def test_a_duplicate_late_in_a_generator_is_refused_before_anything_is_spent():
    calls = []
    session = Session(CallableProvider(lambda call: calls.append(call) or items_reply(call)))
    tasks = review_tasks(25_000) + [review_tasks(1)[0]]
    with pytest.raises(InvalidBatch, match=r"duplicate task_id .*tasks #0 and #25000"):
        session.run_batch("b", iter(tasks), LABEL_SCHEMA, pack=50)
    assert calls == [] and session.ledger.batch_names() == []


def test_values_are_a_read_only_mapping_over_the_ledger_in_task_order(ledger_at, monkeypatch):
    monkeypatch.setattr(values_module, "PAGE_REQUESTS", 2)  # several pages
    tasks = review_tasks(23)
    session = Session(labeller(), ledger=ledger_at())
    values = session.run_batch("b", tasks, LABEL_SCHEMA, pack=3).values
    expected = {t["task_id"]: answer(t) for t in tasks}
    assert len(values) == 23 and list(values) == list(expected)
    assert list(values.items()) == list(expected.items()) and dict(values) == expected
    first = tasks[0]["task_id"]
    assert values[first] == expected[first] and values.get("nope") is None
    assert first in values and "nope" not in values and values == expected
    with pytest.raises(KeyError):
        values["nope"]
    with pytest.raises(TypeError):
        values[first] = {}  # type: ignore[index]
    session.close()


def test_reading_values_back_takes_each_page_as_a_range_of_the_order_index(tmp_path,
                                                                           monkeypatch):
    """A page that scanned or sorted the whole revision made reading every value quadratic."""
    monkeypatch.setattr(values_module, "PAGE_REQUESTS", 2)
    session = Session(labeller(), ledger=tmp_path / "l.sqlite")
    result = session.run_batch("b", review_tasks(9), LABEL_SCHEMA, pack=2)
    store, pages = session.ledger.store, []
    read = store._read
    monkeypatch.setattr(store, "_read", lambda sql, args=(): pages.append((sql, args)) or read(
        sql, args))
    assert len(list(result.values.items())) == 9 and len(pages) == 3
    for sql, args in pages:  # (id, parent, _, detail): the page's requests, then their values
        plan = [tuple(row) for row in read("EXPLAIN QUERY PLAN " + sql, args)]
        page = next(row[0] for row in plan if row[3] == "CO-ROUTINE q")
        assert [row[3] for row in plan if row[1] == page] == [
            "SEARCH requests USING INDEX requests_in_order (revision_id=? AND position>?)"]
        assert not any("SCAN requests" in row[3] for row in plan), plan
    session.close()


def test_values_hold_model_instances_for_a_pydantic_schema(tmp_path):
    class Label(BaseModel):
        verdict: str

    tasks = review_tasks(6)
    ledger = tmp_path / "l.sqlite"
    values = Session(labeller(), ledger=ledger).run_batch("b", tasks, Label, pack=2).values
    assert all(isinstance(v, Label) for v in values.values()) and len(values) == 6


def test_a_generator_of_200000_tasks_runs_in_less_memory_than_its_tasks_as_a_list(tmp_path):
    """A ceiling measured in the same run, never a timing: the peak of the whole run stays
    below that of merely holding its 200,000 tasks as a list (the interpreter and batchjson
    loaded alike), so it fails if the run ever held them all at once. Each child reads its own
    high-water mark (VmHWM): ru_maxrss would carry that of the test process that forked it.
    (tests/test_window.py shows the requests are held a window at a time; bench_scale.py
    holds 1M within 1 GB.)"""
    script = textwrap.dedent("""
        import json, sys
        from batchjson import CallableProvider, Session
        def answer(call):
            return json.dumps({"items": [{"task_id": t["task_id"], "case_id": t["case_id"],
                                          "label": "ok"} for t in call.tasks]})
        tasks = ({"task_id": f"t{i:07d}", "case_id": f"c{i:07d}", "prompt": f"label {i}"}
                 for i in range(200_000))
        schema = {"type": "object", "properties": {"label": {"type": "string"}}}
        if sys.argv[1] == "list":
            held, result = list(tasks), None
        else:
            result = Session(CallableProvider(answer), ledger=sys.argv[1]).run_batch(
                "big", tasks, schema, pack=50, identity=["task_id", "case_id"])
        with open("/proc/self/status") as status:  # this process's own high-water mark
            peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
        print(json.dumps({"accepted": len(result.values) if result else 0,
                          "status": result.status if result else None, "peak_mb": peak / 1024}))
    """)

    def child(arg: str) -> dict:
        out = subprocess.run([sys.executable, "-c", script, arg], capture_output=True,
                             text=True, check=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])

    seen, as_list = child(str(tmp_path / "big.sqlite")), child("list")
    assert seen["accepted"] == 200_000 and seen["status"] == "resolved"
    assert seen["peak_mb"] < as_list["peak_mb"], (seen, as_list)


def test_a_finished_run_of_a_tasks_file_resumes_without_reading_a_task(tmp_path, monkeypatch,
                                                                        ledger_at):
    from batchjson._session import spec as spec_module

    tasks = review_tasks(40)
    path = write_jsonl(tmp_path / "t.jsonl", tasks)
    ledger = ledger_at()
    first = Session(labeller(), ledger=ledger).run_batch("b", path, LABEL_SCHEMA, pack=4)

    def unread(*args, **kwargs):
        raise AssertionError("the tasks were read again")

    monkeypatch.setattr(spec_module, "normalize_tasks", unread)
    again = Session(labeller(), ledger=ledger).run_batch("b", path, LABEL_SCHEMA, pack=4)
    assert (again.calls, again.status, again.resumed, again.revision) == (0, "resolved", 10,
                                                                          first.revision)
    assert dict(again.values) == dict(first.values) and again.total_tasks == 40
    assert again.compared_if_echoed == first.compared_if_echoed == ("candidate_id", "case_id")
    with pytest.raises(AssertionError, match="read again"):  # other rules: the full path
        Session(labeller(), ledger=ledger).run_batch("b", path, LABEL_SCHEMA, pack=5)


def test_a_tasks_file_changed_or_owing_work_takes_the_full_path(tmp_path):
    tasks = review_tasks(12)
    path = write_jsonl(tmp_path / "t.jsonl", tasks)
    ledger = tmp_path / "l.sqlite"
    refusing = CallableProvider(lambda call: "not json")
    owed = Session(refusing, ledger=ledger, repairs=0, replays=0).run_batch(
        "b", path, LABEL_SCHEMA, pack=4, on_exhausted="return")
    assert owed.status == "unresolved" and len(owed.values) == 0
    done = Session(labeller(), ledger=ledger).run_batch("b", path, LABEL_SCHEMA, pack=4)
    assert done.calls == 3 and done.status == "resolved"  # the owed requests were asked
    changed = [dict(t) for t in tasks]
    changed[-1]["case_id"] = "gold-pair-079"
    write_jsonl(path, changed)  # same name, other bytes: its tasks are read and checked
    redone = Session(labeller(), ledger=ledger).run_batch("b", path, LABEL_SCHEMA, pack=4)
    assert redone.revision == done.revision + 1 and redone.calls == 1
    assert redone.values[changed[-1]["task_id"]] == answer(changed[-1])


def test_a_changed_validator_is_not_trusted_by_a_resume_from_a_file(tmp_path, monkeypatch):
    from batchjson._session import spec as spec_module

    tasks = review_tasks(8)
    path = write_jsonl(tmp_path / "t.jsonl", tasks)
    ledger = tmp_path / "l.sqlite"
    allowed = {"match", "no_match"}

    def check(item, task):
        if item["verdict"] not in allowed:
            raise ValueError("unknown verdict")

    first = Session(labeller(), ledger=ledger).run_batch("b", path, LABEL_SCHEMA, pack=4,
                                                         validator=check)
    session = Session(labeller(), ledger=ledger)  # a new kernel: the validator is new to it
    with monkeypatch.context() as patched:  # answered from the ledger, no task read
        patched.setattr(spec_module, "normalize_tasks", None)
        same = session.run_batch("b", path, LABEL_SCHEMA, pack=4, validator=check)
    assert same.calls == 0 and same.revision == first.revision
    assert session.validators.current(first_name(session)).fn is check
    allowed.discard("no_match")  # what the validator reads changed: its answers are re-judged
    with pytest.raises(Exception, match="unresolved"):
        session.run_batch("b", path, LABEL_SCHEMA, pack=4, validator=check, replays=0,
                          repairs=0)


def test_values_materialise_as_jsonl_and_a_dataframe_in_task_order(tmp_path):
    class Label(BaseModel):
        verdict: str

    tasks = review_tasks(7)
    result = Session(labeller(), ledger=tmp_path / "l.sqlite").run_batch("b", tasks, Label,
                                                                          pack=3)
    lines = [json.loads(line) for line in result.to_jsonl().splitlines()]
    assert lines == [{"task_id": t["task_id"], "value": answer(t)} for t in tasks]
    result.to_jsonl(tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_text(encoding="utf-8") == result.to_jsonl()
    import pandas

    frame = result.to_pandas()
    assert isinstance(frame, pandas.DataFrame)
    assert frame.to_dict("records") == [{"task_id": t["task_id"], **answer(t)} for t in tasks]


def test_values_keep_task_order_within_a_pack_whose_ids_do_not_sort_as_text(tmp_path):
    """t8, t9, t10 in one pack: read back as given, not as the ledger's keys sort."""
    tasks = [dict(t, task_id=f"t{n + 8}") for n, t in enumerate(review_tasks(7))]
    session = Session(labeller(), ledger=tmp_path / "l.sqlite")
    result = session.run_batch("b", tasks, LABEL_SCHEMA, pack=3)
    order = [t["task_id"] for t in tasks]
    assert list(result.values) == order and list(dict(result.values)) == order
    assert [json.loads(line)["task_id"] for line in result.to_jsonl().splitlines()] == order
    assert list(result.to_pandas()["task_id"]) == order
    assert list(session.ledger.checkpoint("b")) == order


def test_to_pandas_without_pandas_says_how_to_get_it(monkeypatch):
    result = Session(labeller()).run_batch("b", review_tasks(2), LABEL_SCHEMA)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ConfigError, match="pip install pandas"):
        result.to_pandas()


def first_name(session: Session) -> str:
    return next(iter(session.validators)).name


def test_values_are_read_after_the_session_closed_its_ledger(ledger_at):
    tasks = review_tasks(5)
    session = Session(labeller(), ledger=ledger_at())
    result = session.run_batch("b", tasks, LABEL_SCHEMA, pack=2)
    session.close()
    assert dict(result.values) == {t["task_id"]: answer(t) for t in tasks}
    assert result.values[tasks[0]["task_id"]] == answer(tasks[0])


def test_values_of_an_in_memory_ledger_outlive_its_session():
    tasks = review_tasks(3)
    session = Session(labeller())
    result = session.run_batch("b", tasks, LABEL_SCHEMA)
    session.close()
    assert dict(result.values) == {t["task_id"]: answer(t) for t in tasks}


def test_a_split_revision_run_again_sends_only_its_owed_half_with_its_own_tasks():
    tasks = review_tasks(8)
    poisoned, sent = [tasks[3]["task_id"]], []

    def refuse_one(call):  # one provider (one answer source), refusing one task at first
        sent.append(call)
        return "{" if set(poisoned) & {t["task_id"] for t in call.tasks} else items_reply(call)

    session = Session(CallableProvider(refuse_one), repairs=0, replays=0)
    first = session.run_batch("r", tasks, LABEL_SCHEMA, pack=4, split=True,
                              on_exhausted="return")
    assert len(first.values) == 7
    sent.clear()
    poisoned.clear()
    again = session.run_batch("r", (dict(t) for t in tasks), LABEL_SCHEMA, pack=4, split=True)
    assert [[t["task_id"] for t in call.tasks] for call in sent] == [[tasks[3]["task_id"]]]
    assert dict(again.values) == {t["task_id"]: answer(t) for t in tasks}
    assert again.revision == first.revision


def test_an_unresolved_result_over_a_ledger_file_reports_as_one_in_memory_does(tmp_path):
    tasks = review_tasks(9)
    poisoned = tasks[4]["task_id"]

    def one_wrong(call):
        return items_reply(call, **{poisoned: {"case_id": "gold-pair-079"}})

    def run(ledger):
        return Session(CallableProvider(one_wrong), ledger=ledger, repairs=0, replays=0,
                       ).run_batch("b", tasks, LABEL_SCHEMA, pack=3, on_exhausted="return")

    on_file, in_memory = run(tmp_path / "l.sqlite"), run(None)
    assert not isinstance(on_file.values, dict) and isinstance(in_memory.values, dict)
    assert on_file.unresolved == in_memory.unresolved == [t["task_id"] for t in tasks[3:6]]
    assert on_file.failures == in_memory.failures and on_file.errors == in_memory.errors
    assert on_file.failure_report() == in_memory.failure_report()
    assert on_file._repr_html_() == in_memory._repr_html_()


def test_stored_values_the_schema_no_longer_loads_are_left_out_and_named(tmp_path):
    from types import SimpleNamespace

    from batchjson._session.result import result_values

    tasks = review_tasks(6)
    session = Session(labeller(), ledger=tmp_path / "l.sqlite")
    session.run_batch("b", tasks, LABEL_SCHEMA, pack=2)

    def load(stored):  # as a pydantic model whose rules moved under the stored answers
        if stored["verdict"] == "no_match":
            raise ValueError("verdict no longer allowed")
        return stored

    revision_id = session.ledger.revisions("b")[-1].id
    values, errors = result_values(session.ledger.store, revision_id, SimpleNamespace(
        model=object(), load=load, unseen=("globals()['ALLOWED']",)))
    gone = [t["task_id"] for t in tasks if answer(t)["verdict"] == "no_match"]
    assert dict(values) == {t["task_id"]: answer(t) for t in tasks if t["task_id"] not in gone}
    assert len(values) == 3 and gone[0] not in values and values.get(gone[0]) is None
    assert [(e["type"], e["task_id"]) for e in errors] == [("stored_invalid", g) for g in gone]


def test_a_revisions_tasks_digest_is_that_of_the_whole_array_fed_in_slices(monkeypatch):
    """Keys of revisions on record must not change: hashing a slice at a time (never one text
    of a million tasks) feeds exactly the bytes of the whole array, across slice edges."""
    from batchjson._content import keys as keys_module
    from batchjson._content.tasks import normalize_identity, normalize_tasks, sha

    monkeypatch.setattr(keys_module, "DIGEST_SLICE", 3)
    for n in (1, 3, 4, 7):
        for text in ("é\u2028 ünïcode", "plain", "DEL \x7f and \x01\n\"\\"):
            tasks = [{"task_id": f"t{i}", "prompt": text, "n": i,
                      "nested": [1, {"b": 2, "a": None}]} for i in range(n)]
            whole = sha(json.dumps(tasks, sort_keys=True, separators=(",", ":")))
            held, _, _ = normalize_tasks(iter(tasks), normalize_identity(None), pack=2)
            assert keys_module.tasks_digest(tasks) == keys_module.tasks_digest(held) == whole


def test_checked_tasks_are_held_as_request_texts_and_read_back_as_given():
    """A run keeps each task once, inside its request's text: read back, it is the task."""
    from batchjson._content.keys import Keys
    from batchjson._content.schema import compile_schema
    from batchjson._content.tasks import normalize_identity, normalize_tasks

    tasks = [dict(t, note="é\u2028", n=i) for i, t in enumerate(review_tasks(23))]
    held, texts, _ = normalize_tasks(iter(tasks), normalize_identity(None), pack=5)
    assert len(texts) == 5 and not isinstance(held, list)
    assert len(held) == 23 and held == tasks and list(held) == tasks
    assert held[0] == tasks[0] and held[-1] == tasks[-1] and held[4:11] == tasks[4:11]
    assert held[20:40] == tasks[20:] and held[::7] == tasks[::7]
    with pytest.raises(IndexError):
        held[23]
    keys = Keys.compose(held, compile_schema(LABEL_SCHEMA), "none", 5, None,
                        normalize_identity(None), "items", "src")
    requests = keys.window(held, 0, len(texts))
    assert [list(r.tasks) for r in requests] == [tasks[i:i + 5] for i in range(0, 23, 5)]
    assert requests[-1].task_ids == tuple(t["task_id"] for t in tasks[20:])
    assert requests[1].tasks[1:3] == tuple(tasks[6:8]) and len(requests[-1].tasks) == 3
