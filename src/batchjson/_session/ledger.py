"""The public ``batchjson.Ledger``: the ledger's facade plus what judges or prices, which the ledger
never does: the accounts, import and merge (docs/recovery.md). Import trusts no claimed status:
each return is judged again as a stored answer is (``rejudge.Judging``), each line once; the file
is checked whole first, every number as written. Merge is one idempotent transaction that
rechecks each accepted attempt as import does."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._acceptance.judge import Verdict, sub_return
from .._canon import canonical_json
from .._checks import batch_name
from .._content.keys import Keys
from .._content.schema import ItemSchema, compile_schema
from .._content.strictjson import finite_numbers, parse_as_written
from .._content.tasks import Identity, Request, normalize_identity, normalize_tasks, sha
from .._errors import InvalidBatch
from .._fingerprint.fingerprint import fingerprint_function
from .._ledger import ledger
from .._ledger.records import now
from .._ledger.store import Store
from .._ledger.store_admin import EXPORT_FORMAT, Placement, receipt_of, revision_for, settle
from .._loop import run_sync
from .accounts import Evidence, cost_summary, spend
from .registry import ValidatorVersion
from .rejudge import Judging


class Ledger(ledger.Ledger):
    """Thread-safe access to the ledger: a SQLite file (``path=None`` keeps it in memory) or a
    PostgreSQL database (``"postgresql://user@host/db"``) that runners on many hosts share.
    ``lease``: seconds a runner's claim holds unless renewed (default 30); an expired claim of a
    runner on another host is taken over."""

    def spend(self, name: str | None = None) -> dict[str, Any]:
        """Calls, tokens and cost of every call ever made (one batch or all): :meth:`cost_summary`
        summed. Calls with no recorded cost are counted in ``unknown_cost_calls``;
        ``cost_lower_bound_unknown`` is the least they cost, ``cost_lower_bound`` adds it to the
        known ``cost`` (docs/design.md, "Honest accounts")."""
        return spend(self.store, batch_name(name))

    def cost_summary(self, name: str | None = None) -> dict[str, Any]:
        """Per batch and in total: every attempt's calls, tokens and cost."""
        return cost_summary(self.store, batch_name(name))

    def evidence(self, name: str | None = None) -> dict[str, Any]:
        """What is owed and what was spent (for one batch or all): ``Evidence.summary``."""
        return Evidence(self).summary(batch_name(name))

    def import_receipts(self, path: str | Path, *, validators: Any = None,
                        without_validator: bool = False) -> dict[str, Any]:
        """Import historical receipts, rechecking every item (by ``validators`` too, name ->
        function): the report. A file naming a validator not given is refused unless
        ``without_validator``, which keeps those receipts unverified, never admitted."""
        path, store, registry = Path(path), self.store, registry_view(validators)
        lines = read_lines(path, registry, bool(without_validator))
        placed, seen = Placement(lines), {}  # seen: digest -> the line that imported it
        with store.transaction(whole="the import") as tx:
            outcomes = [_import_once(store, tx, line, registry, str(path), placed, seen)
                        for line in lines]
            revisions = settle(store, tx, placed, {o.line: o.admitted_items for o in outcomes})
        count = {k: sum(o.outcome == k for o in outcomes) for k in OUTCOMES}
        numbered = "receipt" if any(isinstance(o.line, InDocument) for o in outcomes) else "line"
        return {"source": str(path), "lines": len(outcomes), "numbered": numbered, **count,
                "items_admitted": sum(o.admitted_items for o in outcomes),
                "receipts": [o.as_dict() for o in outcomes], "revisions": revisions}

    def merge(self, other: str | Path, *, validators: Any = None) -> dict[str, Any]:
        """Bring another ledger (a file or a ``postgresql://`` URL) in, idempotent: what was
        added, and what was not admitted (each accepted attempt is rechecked against its raw
        return, by ``validators`` too, name -> function)."""
        given = registry_view(validators)
        tables, source, label = ledger.other_tables(self.store, other)
        tables, refused = rechecked(tables, given)
        return {"source": source, **self.store.merge_tables(tables, label),
                "not_admitted": refused}


SUCCESS_WORDS = frozenset({"ok", "success", "succeeded", "accepted", "done", "complete",
                           "completed", "pass", "passed"})
REQUIRED = {"batch": str, "tasks": list, "raw": str, "status": str}
OPTIONAL_NUMBERS = ("input_tokens", "output_tokens", "cached_tokens", "cost")


@dataclass
class Line:
    """One receipt of the file, checked for shape before anything is written."""

    number: int
    record: dict[str, Any]
    digest: str
    tasks: list[dict]
    identity: tuple[str, ...]
    schema: ItemSchema
    components: dict[str, str]
    request: Request
    own: bool  # batchjson's own export format


OUTCOMES = ("admitted", "duplicate", "diagnostic", "rejected", "unverified", "recorded", "skipped")


@dataclass
class Outcome:
    line: int
    batch: str
    claimed_status: str
    outcome: str  # one of OUTCOMES
    items: int
    admitted_items: int = 0
    reason: str = ""
    errors: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "line": int(self.line)}


MAX_INTEGER = 2**63 - 1  # what SQLite stores; a token count beyond it is not a count
TEXT_FIELDS = ("model", "provider", "at")


def read_lines(path: Path, validators: Mapping[str, Any],
               without_validator: bool | None = None) -> list[Line]:
    """Every line checked before anything is written (``without_validator=None``: any named)."""
    validators = registry_view(validators)
    try:
        with path.open("rb") as head:
            if head.read(16) == b"SQLite format 3\x00":
                raise InvalidBatch(f"{path} is a SQLite file, not JSON Lines: to bring another "
                                   f"ledger in, merge it (batchjson merge {path})")
        text = path.read_text(encoding="utf-8-sig")  # a leading BOM is not part of line 1
    except OSError as exc:
        raise InvalidBatch(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InvalidBatch(f"{path} is not UTF-8 text; receipts are JSON Lines") from None
    document = document_receipts(text)
    numbered = ((InDocument(n), r) for n, r in enumerate(document, 1)) if document is not None \
        else parsed_lines(path, text)
    out = []
    for number, record in numbered:
        try:
            if bad := finite_numbers(record):  # every number read as written, or refused
                raise _Refused(f"field {bad[0]}: {bad[1]}")
            out.append(_check(number, record, validators))
        except _Refused as exc:
            raise refuse(path, number, str(exc)) from None
    if not out:
        raise InvalidBatch(f"{path} holds no receipts (expected JSON Lines, one receipt per "
                           "line)")
    missing = sorted({line.record["validator"] for line in out if line.record.get("validator")
                      and line.record["validator"] not in validators})
    if missing and without_validator is False:
        raise InvalidBatch(
            f"{path}: its receipts name validator(s) {', '.join(map(repr, missing))}, not given "
            "here, so their items cannot be rechecked; give each (batchjson import FILE "
            "--validator NAME=module:function; import_receipts(path, validators={NAME: fn})), "
            "or keep those receipts unverified, never admitted (--without-validator; "
            "without_validator=True); nothing was imported")
    return out


def _check(number: int, record: Any, validators: Mapping[str, Any]) -> Line:
    if not isinstance(record, dict):
        raise _Refused("a receipt must be a JSON object")
    own = record.get("format") == EXPORT_FORMAT
    for name, kind in REQUIRED.items():
        value = record.get(name)
        if own and name == "raw" and value is None:
            continue  # an exported provider error or abandoned call has no return
        if not isinstance(value, kind) or (kind is str and name != "raw" and not value):
            what = "a list" if kind is list else "a non-empty string"
            raise _Refused(f"field {name!r} must be {what}, got {value!r:.60}")
    for name in OPTIONAL_NUMBERS:
        value = record.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or value < 0):
            raise _Refused(f"field {name!r} must be a number >= 0 or absent")
        if name.endswith("tokens") and value is not None and (
                value != int(value) or value > MAX_INTEGER):
            raise _Refused(f"field {name!r} must be a whole number of tokens below 2**63, got "
                           f"{value!r:.40}")
    for name in TEXT_FIELDS:
        if record.get(name) is not None and not isinstance(record[name], str):
            raise _Refused(f"field {name!r} must be a string or absent, got "
                           f"{type(record[name]).__name__}")
    mode = record.get("mode", "items")
    if mode not in ("items", "value"):
        raise _Refused(f"mode must be 'items' or 'value', got {mode!r}")
    if mode == "value" and len(record["tasks"]) != 1:
        raise _Refused(f"a 'value' receipt answers one task, this one lists "
                       f"{len(record['tasks'])}")
    identity = _identity_rule(record, own)
    try:
        tasks, texts, _ = normalize_tasks(record["tasks"], identity)
        schema = compile_schema(record.get("schema") or {})
    except InvalidBatch as exc:
        raise _Refused(str(exc)) from None
    validator_name = record.get("validator")
    if validator_name is not None and not (isinstance(validator_name, str) and validator_name):
        raise _Refused("field 'validator' must be a validator's name (a string)")
    version = validators.get(validator_name) if validator_name else None
    if own and isinstance(record.get("components"), dict):
        keys = Keys({str(k): str(v) for k, v in record["components"].items()})
        if altered := _unlike_components(keys.components, record, schema):
            raise _Refused(f"{altered} (the receipt was altered); export it again from the "
                           "ledger that ran it")
    else:  # as a live run of this content composes them, its answer source unknown
        keys = Keys.compose(
            tasks, schema, version.fingerprint.digest if version is not None else "none",
            len(tasks), None, identity, mode, source=None)
    request = keys.pack(tasks, len(tasks), texts)[0]  # the key a live run looks up
    claimed_key = record.get("request_key") if own else None
    if claimed_key is not None and claimed_key != request.key:
        # The key is what a later run resumes by: one that is not the hash of this receipt's
        # own tasks and content would serve these answers to other tasks.
        raise _Refused(f"request_key {str(claimed_key)[:16]}... is not the key of this receipt's "
                       "tasks and components (the receipt was altered); drop request_key to "
                       "import it under the key its content gives")
    kept = dict(keys.components) if own else {**keys.components, **dict([schema.document])}
    return Line(number, record, sha(canonical_json(record)), tasks, identity, schema, kept,
                request, own)  # a revision keeps its schema, so its export is rechecked


def _unlike_components(components: Mapping[str, str], record: Mapping[str, Any],
                       schema: ItemSchema) -> str | None:
    """What of an exported receipt does not follow from its components."""
    shape = components.get("schema_shape")  # a model's: its structure, as run
    text = json.dumps(record.get("schema"), sort_keys=True, separators=(",", ":"))
    if components.get("schema") not in (schema.fingerprint, None) and shape != text:
        return "its schema is not the one its components name"
    if components.get("validator", "none") != "none" and not record.get("validator"):
        return "it names no validator, though its components name the one that judged it"
    return None


def _identity_rule(record: Mapping[str, Any], own: bool) -> Identity:
    """An export keeps the identity it was judged under; any other compares every echo."""
    exported = own and isinstance(record.get("components"), dict)
    listed = record.get("identity")
    if listed is None and not exported:
        listed = []
    if not isinstance(listed, list):
        raise _Refused(f"field 'identity' must be a list of field names"
                       f"{'' if exported else ' (or absent)'}, got {listed!r:.60}")
    try:
        identity = Identity(normalize_identity(listed),
                            echo=not exported or record.get("identity_echo") is True)
    except InvalidBatch as exc:
        raise _Refused(str(exc)) from None
    if exported:  # the key says how its answers were judged: a weaker rule must not ride on it
        for part, own_value, shown in (("identity", identity.key, 80),
                                       ("mode", record.get("mode", "items"), 40)):
            judged = record["components"].get(part)
            if judged != own_value:
                raise _Refused(f"its {part} {own_value!r} is not the one its components name "
                               f"({str(judged)!r:.{shown}}; the receipt was altered); give the "
                               f"{part} the batch ran with")
    return identity


def registry_view(validators: Any) -> dict[str, Any]:
    """name -> validator version, from a registry, a mapping, or named functions."""
    if validators is None:
        return {}
    pairs = (validators.items() if isinstance(validators, Mapping) else
             [(getattr(v, "name", None) or getattr(v, "__name__", None), v) for v in validators])
    out = {}
    for name, given in pairs:
        if not hasattr(given, "fn"):
            if not callable(given) or not isinstance(name, str) or not name:
                raise InvalidBatch(f"validators must map names to functions (or list named "
                                   f"functions); got {name!r}: {type(given).__name__}")
            given = ValidatorVersion(name, 0, fingerprint_function(given), given, now(),
                                     "given")  # unnumbered: handed to an import or a merge
        out[name] = given
    return out


def _judge(line: Line, version: Any) -> Verdict:
    """A receipt's raw return judged as a call's is (an own partial receipt item by item)."""
    return Judging(line.record.get("mode", "items"), line.identity, line.schema,
                   version.fn if version is not None else None, run_sync,
                   "items" if _partial(line) else "whole").verdict(line.record["raw"], line.tasks)


def _partial(line: Line) -> bool:
    return line.own and line.record.get("status") == "partial"


def _import_once(store: Store, tx: Any, line: Line, registry: Mapping[str, Any], source: str,
                 placed: Placement, seen: dict[str, int]) -> Outcome:
    """One line imported, unless its digest was, or its attempt is here and it completes none."""
    rec = line.record
    base = Outcome(line.number, rec["batch"], str(rec.get("status")), "skipped", len(line.tasks))
    uid = rec.get("uid") if line.own and isinstance(rec.get("uid"), str) else None
    done, held = store.imported_before(tx, line.digest, uid)
    if done is not None or line.digest in seen:
        where = (f"line {seen[line.digest]} of this file" if line.digest in seen
                 else f"line {done['line']} of {done['source']}")
        base.reason = f"already imported ({where})"
        return base
    # Exported while that call was in flight, finished since: its outcome completes the
    # receipt already here (the same call, not a second one).
    completes = (held is not None and held["status"] in ("in_flight", "abandoned")
                 and rec.get("status") not in ("in_flight", "abandoned"))
    if held is not None and not completes:
        base.reason = "this attempt is already in the ledger (same uid)"
        return base
    seen[line.digest] = line.number
    where = ((held["batch_id"], None) if completes  # the receipt it completes: its batch
             else revision_for(store, tx, line, placed))
    return _import_line(store, tx, line, registry, uid, source, where,
                        held["id"] if completes else None)


def _import_line(store: Store, tx: Any, line: Line, registry: Mapping[str, Any],
                 uid: str | None, source: str, where: tuple[int, int | None],
                 completes: int | None = None) -> Outcome:
    rec = line.record
    claimed = str(rec.get("status"))
    out = Outcome(line.number, rec["batch"], claimed, "rejected", len(line.tasks))
    batch_id, revision_id = where
    usage = {k: rec.get(k) for k in OPTIONAL_NUMBERS} | {"model": rec.get("model")}
    status, errors, stored = _judged(line, registry.get(rec.get("validator") or ""), out)
    parts = None
    if status == "partial":  # split as the live run splits it: the accepted part is admitted
        kept, rest = Keys(line.components).apart(line.request, {e["task_id"] for e in errors})
        parts = (line.request, kept, rest, sub_return(rec["raw"], kept.task_ids))
    if status in ("accepted", "partial"):
        held = store.accepted_items(tx, batch_id, (parts[1] if parts else line.request).key)
        if held:  # the ledger's accepted values are never replaced by an import
            differ = sum(held.get(k) != v for k, v in stored.items())  # one form: the texts
            out.outcome, out.admitted_items = "duplicate", 0
            out.reason = ("passed the recheck, but this ledger already holds accepted values "
                          "for the same request; they are kept"
                          + (f" ({differ} of this return's items differ from them)" if differ
                             else " (this return's values are the same)")
                          + "; the return counts in the account")
            stored = {}
    if completes is not None:
        out.reason = "; ".join(filter(None, [out.reason, "completes the receipt of this call, "
                                             "unfinished when it was last seen here"]))
    recorded = store.record_import(tx, {
        "batch_id": batch_id, "revision_id": revision_id, "request": line.request,
        "provider": rec.get("provider") or "import", "model": rec.get("model"),
        "at": str(rec.get("at") or now()), "uid": uid or f"import-{line.digest[:32]}",
        "sent_at": rec.get("at"), "raw": rec.get("raw"),
        # batchjson's own export names its answer source; another file's is unknown
        "source": rec.get("source") if line.own and isinstance(rec.get("source"), str) else None,
        "digest": line.digest, "file": source, "line": int(line.number), "outcome": out.outcome,
        "parts": parts,
    }, status=status, errors=errors, stored=stored, usage=usage, completes=completes)
    if recorded != out.outcome:  # another return for this request was admitted here first
        out.outcome, out.admitted_items = recorded, 0
        out.reason = ("passed the recheck, but another return for the same request was "
                      "admitted in this ledger first (whole or in part); its values are kept; "
                      "the return counts in the account")
    return out


def _judged(line: Line, version: Any, out: Outcome) -> tuple[str, list, dict[str, Any]]:
    """(status, errors, stored items) of one imported receipt, its outcome said in ``out``."""
    rec = line.record
    claimed, name = str(rec.get("status")), rec.get("validator")
    success = claimed.strip().lower() in SUCCESS_WORDS or _only_unverified(rec) or _partial(
        line)
    if line.own and (rec.get("raw") is None or not success):  # as its own ledger judged it
        status, errors = _exported_status(rec), list(rec.get("errors") or [])
        out.outcome, out.reason, out.errors = "recorded", f"exported {status} attempt", errors
        return status, errors, {}
    if name and version is None:  # the user opted out of its validator
        return _unverified(out, f"its validator {name!r} was not given (imported without it), "
                           "so it is kept unverified: shown and exported, never admitted")
    verdict = _judge(line, version)
    identity = [{k: e.get(k) for k in ("task_id", "field", "expected", "got", "message")}
                for e in verdict.errors if e.get("type") == "identity"]
    if identity:
        out.outcome, out.errors = "diagnostic", identity
        fields = sorted({e["field"] for e in identity if e.get("field")})
        out.reason = (f"identity error in {len(identity)} item(s) ({', '.join(fields)}); "
                      f"receipt claimed {claimed!r}; none of its {len(line.tasks)} items "
                      "admitted")
        return "rejected", verdict.errors, {}
    out.errors = [{k: e.get(k) for k in ("type", "task_id", "message")} for e in verdict.errors]
    if verdict.partial:  # its rest stays owed, as it was where it was exported from
        out.outcome, out.admitted_items = "admitted", len(verdict.stored)
        out.reason = (f"accepted in part, as exported: {len(verdict.stored)} of "
                      f"{len(line.tasks)} items passed the recheck")
        return "partial", verdict.errors, verdict.stored
    if not verdict.accepted:
        out.reason = f"recheck rejected it ({verdict.errors[0]['type']}); claimed {claimed!r}"
        return "rejected", verdict.errors, {}
    if not success and not rec.get("schema"):
        return _unverified(out, f"receipt claimed {claimed!r} and it carries no schema, so the "
                           "recheck cannot overrule the claim")
    out.outcome, out.admitted_items = "admitted", len(line.tasks)
    notes = []
    if not success:
        notes.append(f"receipt claimed {claimed!r} but every check passed")
    if line.own and version is not None and version.fingerprint.digest != line.components.get(
            "validator"):
        notes.append(f"judged by the validator {name!r} given, not the version it ran with")
    out.reason = "; ".join(notes) or "every check passed"
    return "accepted", [], verdict.stored


def _unverified(out: Outcome, why: str) -> tuple[str, list, dict[str, Any]]:
    errors = [{"type": "unverified", "task_id": None, "message": why}]
    out.outcome, out.reason, out.errors = "unverified", why, errors
    return "rejected", errors, {}


def _exported_status(rec: Mapping[str, Any]) -> str:
    status = rec.get("status")
    return (status if status in ("rejected", "provider_error", "abandoned", "cancelled")
            and (status != "rejected" or rec.get("raw") is not None) else "abandoned")


def _only_unverified(rec: Mapping[str, Any]) -> bool:
    """A receipt batchjson kept unverified (its validator not given): a claim of nothing."""
    errors = rec.get("errors")
    return (rec.get("format") == EXPORT_FORMAT and rec.get("status") == "rejected"
            and isinstance(errors, list) and bool(errors)
            and all(isinstance(e, dict) and e.get("type") == "unverified" for e in errors))


def refuse(path: Path, number: int, problem: str) -> InvalidBatch:
    what = "receipt" if isinstance(number, InDocument) else "line"
    return InvalidBatch(f"{path}, {what} {int(number)}: {problem}; nothing was imported (fix "
                        f"the {what} and import the file again)")


class _Refused(InvalidBatch):
    """What is wrong with one receipt, said by its line (or receipt number) where it is read."""


class InDocument(int):
    """A receipt's number in an export's JSON document, which is said as "receipt N"."""


def document_receipts(text: str) -> list[Any] | None:
    """The receipts of ``batchjson export``'s JSON document; None for JSON Lines."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        document = parse_as_written(text)
    except ValueError:  # several lines of JSON, or not JSON: read as lines
        return None
    if not isinstance(document, dict) or "batch" in document or not isinstance(
            document.get("receipts"), list):
        return None
    return document["receipts"]


def parsed_lines(path: Path, text: str) -> Iterable[tuple[int, Any]]:
    # split on newlines only: a JSON string may hold U+2028 or a form feed, which
    # str.splitlines would cut through; a CRLF file's CR is dropped
    for number, raw_line in enumerate(text.split("\n"), 1):
        if not raw_line.strip():
            continue
        try:
            record = parse_as_written(raw_line.removesuffix("\r"))
        except ValueError as exc:
            raise refuse(path, number, f"not JSON ({exc})") from None
        yield number, record


def rechecked(tables: dict[str, Any], validators: Mapping[str, Any]
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The other ledger's tables, only what follows from its receipts admitted; the rest named."""
    revisions = {r["id"]: r for r in tables["revisions"]}
    names = {b["id"]: b["name"] for b in tables["batches"]}
    tasks = {(q["revision_id"], q["key"]): q["tasks"] for q in tables["requests"]}
    stored: dict[int, list[Any]] = {}
    for row in tables["checkpoint"]:
        stored.setdefault(row["attempt_id"], []).append(row)
    refused: dict[int, str] = {}
    named = []
    for attempt in tables["attempts"]:
        if attempt["status"] != "accepted":
            continue
        revision = revisions[attempt["revision_id"]]
        record = receipt_of({**dict(attempt), "batch": names[attempt["batch_id"]],
                             "revision": revision["number"], "current": False,
                             "components": revision["components"],
                             "validator_name": revision["validator_name"],
                             "tasks": tasks.get((attempt["revision_id"],
                                                 attempt["request_key"]))}, 0)
        why = _not_following(record, stored.get(attempt["id"], []), validators)
        if why:
            refused[attempt["id"]] = why
            named.append({"batch": record["batch"], "uid": attempt["uid"], "reason": why})
    accepted = {a["id"] for a in tables["attempts"] if a["status"] == "accepted"}
    for row in tables["checkpoint"]:
        if row["attempt_id"] not in accepted:
            named.append({"batch": names.get(row["batch_id"]), "uid": None, "reason":
                          f"a value stored for task {row['task_id']!r} without an accepted "
                          "attempt of its own"})
    attempts = [a if a["id"] not in refused else {**dict(a), "status": "rejected", "errors":
                json.dumps([{"type": "merge_recheck", "task_id": None,
                             "message": refused[a["id"]]}])} for a in tables["attempts"]]
    kept = [c for c in tables["checkpoint"] if c["attempt_id"] in accepted - set(refused)]
    return {**tables, "attempts": attempts, "checkpoint": kept}, named


def _not_following(record: dict[str, Any], rows: list[Any], validators: Mapping[str, Any]
                   ) -> str:
    """Why an accepted attempt's values are not admitted ("" when they are)."""
    try:
        line = _check(1, record, validators)
    except InvalidBatch as exc:
        return str(exc)
    verdict = _judge(line, validators.get(record.get("validator") or ""))
    if not verdict.accepted:
        first = verdict.errors[0]
        return f"its raw return fails the recheck ({first['type']}: {first['message']})"
    derived, by_id = verdict.stored, {t["task_id"]: t for t in line.tasks}
    for row in rows:
        value, task_id = json.loads(row["item"]), row["task_id"]
        if task_id not in derived:
            return f"a value is stored for task {task_id!r}, which its request did not ask"
        returned = json.loads(derived[task_id])
        if not _follows(value, returned, by_id[task_id]):
            return (f"the value stored for task {task_id!r} is not what its raw return gives "
                    f"(stored {row['item'][:80]}, "
                    f"returned {canonical_json(returned)[:80]})")
    return ""


def _follows(value: Any, derived: Any, task: Mapping[str, Any]) -> bool:
    if not isinstance(value, dict) or not isinstance(derived, dict):
        return canonical_json(value) == canonical_json(derived)
    return (all(k in value and canonical_json(value[k]) == canonical_json(v)
                for k, v in derived.items())
            and all(k in task and canonical_json(v) == canonical_json(task[k])
                    for k, v in value.items() if k not in derived))
