"""Keys: the one type that composes every key of a run or an import, and the answer source. A
request key covers what the model saw (the *seen* content) and how its return is judged; an
import's answers are keyed without a source (*sourceless*), as a live run finds and re-judges."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from .._canon import Unhashable, canonical_json, content_hash, qualname
from .._checks import whole
from .._errors import ProviderSetupError
from .._fingerprint.fingerprint import fingerprint_callable, fingerprint_function
from .._sources import Code, Digest, Hashed
from .tasks import ECHOED, Identity, PackedTasks, Request, sha

# The revision components that key every request besides its tasks ("unseen": judging no
# fingerprint fully sees, see _session/rejudge.py).
KEY_COMPONENTS = ("schema", "validator", "instructions", "identity", "mode", "source", "unseen")
# What keys answers of unknown source: receipts imported from another system (keyed with the
# identity fields alone, no "+echoed").
SOURCELESS_COMPONENTS = ("schema", "validator", "instructions", "identity", "mode")


def _key_content(components: Mapping[str, str]) -> dict[str, str]:
    """The part of a revision's components that keys its requests (sourceless, if no source)."""
    if "source" in components:
        return {k: components[k] for k in KEY_COMPONENTS if k in components}
    out = {k: components[k] for k in SOURCELESS_COMPONENTS if k in components}
    if "identity" in out:
        out["identity"] = out["identity"].removesuffix(ECHOED)
    return out


DIGEST_SLICE = 1000  # tasks encoded at once while hashing: the whole is never one text


def tasks_digest(task_list: Sequence[Mapping[str, Any]]) -> str:
    """The ``tasks`` component of a revision: the SHA-256 of every task in order as one JSON array
    (sorted keys, ASCII), fed a slice at a time; a held ASCII request text is hashed as it is."""
    if isinstance(task_list, PackedTasks):  # an ASCII request text is those bytes already
        arrays: Iterable[str] = (  # DEL: escaped in ASCII JSON only
            text if text.isascii() and "\x7f" not in text else _ascii_json(json.loads(text))
            for text in task_list.texts)
    else:
        arrays = (_ascii_json(list(task_list[start:start + DIGEST_SLICE]))
                  for start in range(0, len(task_list), DIGEST_SLICE))
    hasher = hashlib.sha256(b"[")
    for n, text in enumerate(arrays):  # each a JSON array of one or more tasks
        hasher.update((("," if n else "") + text[1:-1]).encode("utf-8"))
    hasher.update(b"]")
    return hasher.hexdigest()


_ascii_json = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def key_maker(content: Mapping[str, str]) -> Callable[[str], str]:
    """The key of ``{"tasks": <tasks>, **content}`` as a function of the tasks' canonical JSON,
    spliced between the sorted ``"key":value`` pairs around it, encoded once."""
    members = sorted({"tasks": None, **content}.items())
    where = [k for k, _ in members].index("tasks")
    encoded = [f"{canonical_json(k)}:{canonical_json(v)}" for k, v in members]
    head = "{" + "".join(part + "," for part in encoded[:where]) + '"tasks":'
    tail = "".join("," + part for part in encoded[where + 1:]) + "}"
    made: dict[str, str] = {}  # a run's passes (survey, record, send) key each text once
    held = [0]  # characters of the texts ``made`` keeps alive
    headed = hashlib.sha256(head.encode("utf-8"))  # the schema and all before the tasks, once

    def key(tasks_json: str) -> str:
        found = made.get(tasks_json)
        if found is None:
            if len(made) >= KEYS_HELD or held[0] > KEY_TEXT_CHARS:  # bounded: a stream of
                made.clear()  # millions, or of long texts, keys its texts again
                held[0] = 0
            held[0] += len(tasks_json)
            hasher = headed.copy()  # sha(head + tasks_json + tail), the head not hashed again
            hasher.update((tasks_json + tail).encode("utf-8"))
            found = made[tasks_json] = hasher.hexdigest()
        return found

    return key


# What each key function remembers (a Keys has three): the keys of up to this many recent texts,
# and those texts, of about this many characters (the latest text beyond it); then it starts
# over. A run held in memory is keyed once; the texts it keeps alive, the run holds anyway.
KEYS_HELD = 1 << 14
KEY_TEXT_CHARS = 1 << 20


@dataclass(frozen=True)
class Keys:
    """Every key of one content: ``components`` (the revision's, as stored) and ``seen`` (what
    the model saw; None for components read back from an export)."""

    components: Mapping[str, str]
    seen: Mapping[str, str] | None = None

    @classmethod
    def compose(cls, task_list: Sequence[Mapping[str, Any]], schema: Any, validator: str,
                pack: int, instructions: str | None, identity: Identity, mode: str,
                source: str | None, digest: str | None = None) -> Keys:
        """The keys of a run, or of an import (``source`` None); ``digest``: the tasks'."""
        components = {
            "tasks": digest or tasks_digest(task_list),
            "schema": schema.fingerprint, "validator": validator, "pack": str(pack),
            "instructions": sha(instructions or ""), "identity": identity.key, "mode": mode,
        }
        seen = {"wire": sha(canonical_json(schema.json_schema)),
                "instructions": components["instructions"], "identity": ",".join(identity),
                "mode": mode}
        if source is not None:
            components["source"] = seen["source"] = source
        return cls(components, seen)

    @property
    def revision(self) -> str:
        return sha(json.dumps(dict(self.components), sort_keys=True))

    @cached_property
    def content(self) -> dict[str, str]:
        return _key_content(self.components)

    @cached_property
    def request(self) -> Callable[[str], str]:
        return key_maker(self.content)

    @cached_property
    def seen_key(self) -> Callable[[str], str]:
        """What a request's model saw: where earlier returns that may be re-judged are found."""
        assert self.seen is not None, "components read back carry no seen content"
        return key_maker(self.seen)

    @cached_property
    def sourceless(self) -> Callable[[str], str]:
        """A request's key with its answer source unknown, as an import of it writes."""
        return key_maker(_key_content({k: v for k, v in self.components.items()
                                       if k != "source"}))

    def with_part(self, name: str, value: str) -> Keys:
        """The same keys with one more revision component that keys requests (``unseen``)."""
        return replace(self, components={**self.components, name: value})

    def pack(self, tasks: Sequence[dict], pack: int,
             texts: Sequence[str] | None = None) -> list[Request]:
        """Group tasks ``pack`` at a time (``texts``: their canonical JSON, if made)."""
        whole("pack", pack, 1)
        if texts is None:
            texts = [canonical_json(t) for t in tasks]
        packed = ["[" + ",".join(texts[i:i + pack]) + "]" for i in range(0, len(texts), pack)]
        return self.window(PackedTasks(packed, pack, len(texts)), 0, len(packed))

    def window(self, tasks: PackedTasks, start: int, stop: int) -> list[Request]:
        """Requests ``start`` to ``stop`` of checked tasks held as their requests' texts."""
        return [Request(self.request(text), tasks.request(position, text), position,
                        tasks_json=text)
                for position, text in enumerate(tasks.texts[start:stop], start)]

    def split(self, request: Request) -> list[Request]:
        """Deterministic halving: the first half keeps the extra task on odd sizes."""
        middle = (len(request.tasks) + 1) // 2
        return self._children(request, (request.tasks[:middle], request.tasks[middle:]))

    def apart(self, request: Request, rejected: Iterable[str]) -> tuple[Request, Request]:
        """A request answered in part (``accept="items"``) as two children keyed as halves are:
        the tasks accepted, and those ``rejected``, in task order."""
        out = set(rejected)
        kept, rest = self._children(request, (
            [t for t in request.tasks if t["task_id"] not in out],
            [t for t in request.tasks if t["task_id"] in out]))
        return kept, rest

    def _children(self, request: Request, parts: Iterable[Sequence[dict]]) -> list[Request]:
        encoded = [(canonical_json(list(part)), tuple(part)) for part in parts if part]
        return [Request(self.request(text), part, request.position, parent_key=request.key,
                        tasks_json=text) for text, part in encoded]


# Settings that decide answers, read when a provider defines no ``source_key()``.
_ANSWER_SETTINGS = ("name", "model", "base_url", "temperature", "top_p", "max_tokens", "seed",
                    "response_format", "mode", "extra_body", "answer", "faults", "fn", "source")


def answer_source(provider: Any) -> str:
    """Where answers come from, part of every request key (another model, endpoint or setting
    never reuses them): the provider's class and its :func:`source_text`'s digest."""
    return f"{qualname(type(provider))}:{sha(source_text(provider))}"


def source_text(provider: Any) -> str:
    """What decides a provider's answers, as text (never its API key): its ``source_key()`` (or
    a tuple of ``_sources`` parts passed alone), else the settings above that it has."""
    own = getattr(provider, "source_key", None)
    detail = provider if isinstance(provider, tuple) else own() if callable(own) else {
        name: getattr(provider, name) for name in _ANSWER_SETTINGS if hasattr(provider, name)}
    if isinstance(detail, tuple):
        return "".join(map(_resolved, detail))
    if isinstance(detail, str):
        return detail
    items = detail.items() if isinstance(detail, Mapping) else [("", detail)]
    plain = (str, int, float, bool, type(None))  # a setting as it is, else its code's key
    return canonical_json({str(k): v if isinstance(v, plain) else fingerprint_callable(v).digest
                           for k, v in items})


def _resolved(part: Any) -> Any:
    """One part of a source description, as text (lists inside :class:`Hashed` as they are)."""
    if isinstance(part, Code):
        return _code_digest(part)
    if isinstance(part, Digest):
        try:
            return content_hash(part.value)[:16]
        except Unhashable:
            if part.fallback is None:
                raise
            return hashlib.sha256(part.fallback()).hexdigest()[:16]
    if isinstance(part, Hashed):
        return sha(json.dumps([_resolved(p) for p in part.items]))
    if isinstance(part, list):
        return [_resolved(p) for p in part]
    return part


def _code_digest(part: Code) -> str:
    fingerprint = (fingerprint_callable if part.whole else fingerprint_function)(part.obj)
    if part.owner is not None and fingerprint.partial:
        # reading what no fingerprint sees (eval), its answers could change under one key
        raise ProviderSetupError(
            f"{part.owner}: the answer function reads values batchjson cannot see "
            f"({', '.join(fingerprint.unseen)}), so its stored answers could not safely be "
            "matched to it; name the answer source instead, CallableProvider(fn, "
            "source='my-model-v1'), and change the name when its answers change")
    part.fingerprint = fingerprint
    return fingerprint.digest if part.length is None else fingerprint.digest[:part.length]
