"""Where imported attempts go: one revision per batch and way of judging, every admitted item
visible.

The receipts of one batch in one import that are judged alike (schema, validator, identity,
mode, instructions; for batchjson's own exports, the revision they were exported from) form one
revision, so ``values`` and ``status`` show every item the import admitted. Receipts of one
batch judged differently are kept apart in revisions of their own: for a batch new to the
ledger the one that was current where it was exported, else the one with the most admitted
items, becomes current and the others are recorded beside it (superseded), each named in the
report. Beside a live batch an import never changes what the batch is working on: its
revisions are superseded by the batch's current one, and the report says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any

from .._canon import canonical_json
from .._content.keys import Keys, tasks_digest
from .records import now
from .store import Store

# The components that say how a receipt was judged (tasks and pack say what was asked).
JUDGING = ("schema", "validator", "instructions", "identity", "mode", "source", "unseen")
KEPT = (*JUDGING, "schema_doc", "schema_shape")  # the schema itself, so an export rechecks it
BESIDE_LIVE = "imported beside the batch's current revision"


@dataclass
class Group:
    """Receipts of one batch judged alike: one revision."""

    batch: str
    components: dict[str, str]
    own: bool
    validator_name: str | None
    tasks: dict[str, dict] = field(default_factory=dict)  # canonical JSON -> task, in order
    pack: int = 0
    current_there: bool = False  # an export of the revision current where it was exported
    revision_id: int | None = None

    def _add(self, line: Any) -> None:
        for task in line.tasks:
            self.tasks.setdefault(canonical_json(task), task)
        self.pack = max(self.pack, len(line.tasks))
        self.current_there |= line.own and line.record.get("current") is True

    def _revision_components(self) -> dict[str, str]:
        if self.own:  # as exported: the revision it came from
            return self.components
        return {**self.components, "tasks": tasks_digest(list(self.tasks.values())),
                "pack": str(self.pack)}


def _group_lines(lines: Iterable[Any]) -> dict[int, Group]:
    """line number -> its group."""
    groups: dict[tuple[str, str], Group] = {}
    out = {}
    for line in lines:
        judged = {k: v for k, v in line.components.items() if k in KEPT}
        key = (line.record["batch"], Keys(line.components).revision if line.own
               else canonical_json([judged, line.record.get("validator")]))
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(line.record["batch"],
                                        line.components if line.own else judged, line.own,
                                        line.record.get("validator"))
        group._add(line)
        out[line.number] = group
    return out


@dataclass
class Placement:
    """Where one import puts its attempts: its lines' groups, and per revision touched, its
    lines (as ``revision_for`` places them) and admitted items (once ``settle`` is told)."""

    lines_read: InitVar[Iterable[Any]]
    groups: dict[int, Group] = field(init=False)  # line number -> its group
    fresh: dict[str, bool] = field(default_factory=dict)  # batch -> new when the import began
    lines: dict[int, list[int]] = field(default_factory=dict)
    admitted: dict[int, int] = field(default_factory=dict)
    current_there: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self, lines_read: Iterable[Any]) -> None:
        self.groups = _group_lines(lines_read)


def revision_for(store: Store, tx: Any, line: Any, placed: Placement) -> tuple[int, int]:
    """The batch and revision an imported attempt belongs to, the line placed there: a
    revision of the batch already holding its request, else its group's revision (found or
    made once per import)."""
    name, stamp, group = line.record["batch"], now(), placed.groups[line.number]
    batch_id, current = store._batch_row(tx, name, stamp)
    placed.fresh.setdefault(name, current is None)
    revision_id = store._revision_holding(tx, batch_id, line.request.key, group.revision_id)
    if revision_id is None:
        if group.revision_id is None:
            group.revision_id = _group_revision(store, tx, batch_id, current, group,
                                                placed.fresh[name], stamp)
            placed.current_there[group.revision_id] = group.current_there
        store._add_import_request(tx, group.revision_id, line.request)
        revision_id = group.revision_id
    placed.lines.setdefault(revision_id, []).append(line.number)
    return batch_id, revision_id


def _group_revision(store: Store, tx: Any, batch_id: int, current: int | None, group: Group,
                    fresh: bool, stamp: str) -> int:
    """The revision with the group's content; else the batch's current revision when an
    earlier import made it and judged alike (a history file imported again as it grows);
    else a new one: open for a batch new to the ledger, beside a live batch superseded."""
    components = group._revision_components()
    fingerprint = Keys(components).revision
    found = store._revision_with(tx, batch_id, fingerprint)
    if found is not None:
        return found
    if current is not None and not group.own and _imported_alike(store, tx, current, group):
        return current
    revision_id = store._add_revision(tx, batch_id, fingerprint, components, stamp,
                                     validator=(group.validator_name, None),
                                     superseded_by=None if fresh else current,
                                     reason=BESIDE_LIVE)
    if current is None:
        store._make_current(tx, batch_id, revision_id)
    return revision_id


def _imported_alike(store: Store, tx: Any, revision_id: int, group: Group) -> bool:
    """Whether ``revision_id`` was made by an import (no answer source, no live attempt) and
    judges as ``group`` does."""
    theirs = store._imported_revision(tx, revision_id)
    return theirs is not None and "source" not in theirs and {
        k: v for k, v in theirs.items() if k in KEPT} == group.components


def settle(store: Store, tx: Any, placed: Placement,
           admitted: Mapping[int, int]) -> list[dict[str, Any]]:
    """For each batch new to the ledger that this import gave several revisions, make one
    current (the one current where it was exported, else the most admitted items, else the
    latest line) and record the others beside it; then describe every revision touched.
    ``admitted``: how many items each line (by number) admitted."""
    for revision_id, lines in placed.lines.items():
        placed.admitted[revision_id] = sum(admitted.get(number, 0) for number in lines)
    rows = {r["id"]: r for r in store._revision_rows(tx, list(placed.lines))}
    by_batch: dict[str, list[int]] = {}
    for revision_id in placed.lines:
        by_batch.setdefault(rows[revision_id]["batch"], []).append(revision_id)
    for name, ids in by_batch.items():
        made = [i for i in ids if rows[i]["status"] == "open" and placed.fresh.get(name)]
        if len(made) < 2:
            continue
        winner = max(made, key=lambda i: (placed.current_there.get(i, False),
                                          placed.admitted.get(i, 0), max(placed.lines[i])))
        store._make_current(tx, rows[winner]["batch_id"], winner)
        for other in made:
            if other != winner:
                differ = _differences(rows[other]["components"], rows[winner]["components"])
                store._supersede_by_import(tx, other, winner, f"imported beside revision "
                                f"{rows[winner]['number']}: its receipts differ in "
                                f"{', '.join(differ)}")
    rows = {r["id"]: r for r in store._revision_rows(tx, list(placed.lines))}
    return [_describe(rows[i], placed) for ids in by_batch.values() for i in ids]


def _differences(mine: str, theirs: str) -> list[str]:
    a, b = json.loads(mine), json.loads(theirs)
    return [k for k in JUDGING if a.get(k) != b.get(k)] or ["the tasks asked"]


def _describe(row: Any, placed: Placement) -> dict[str, Any]:
    return {"batch": row["batch"], "revision": row["number"], "current": bool(row["current"]),
            "current_revision": row["current_number"], "lines": placed.lines[row["id"]],
            "admitted_items": placed.admitted.get(row["id"], 0),
            "reason": "" if row["current"] else (row["supersede_reason"] or "")}
