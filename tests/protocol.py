"""What the providers' real responses look like, for tests that hold the loopback server to them:
header formats, the structure (key paths and JSON types) of a body, and the recorded fixtures."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).parent / "fixtures" / "recorded"

OPENAI_REQUEST_ID = re.compile(r"req_[0-9a-f]{32}")
ANTHROPIC_REQUEST_ID = re.compile(r"req_011C[1-9A-HJ-NP-Za-km-z]{20}")
GO_DURATION = re.compile(r"0s|\d+ms|(\d+h)?(\d+m)?\d+(\.\d+)?s")
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
OPENAI_LIMIT_HEADERS = tuple(f"x-ratelimit-{part}-{bucket}" for bucket in ("requests", "tokens")
                             for part in ("limit", "remaining", "reset"))
ANTHROPIC_LIMIT_HEADERS = tuple(
    f"anthropic-ratelimit-{bucket}-{part}"
    for bucket in ("requests", "tokens", "input-tokens", "output-tokens")
    for part in ("limit", "remaining", "reset"))


def recorded(name: str) -> dict[str, Any]:
    """A recorded fixture, its body parsed from the exact text where the recording kept it."""
    data = json.loads((RECORDED / name).read_text(encoding="utf-8"))
    if "body" not in data:
        data["body"] = json.loads(data["body_text"])
    return data


def recorded_names(protocol: str) -> list[str]:
    return sorted(f"{protocol}/{p.name}" for p in (RECORDED / protocol).glob("*.json"))


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def structure(value: Any, path: str = "$") -> dict[str, set[str]]:
    """Every key path in ``value`` (list items as ``[]``) with the JSON types seen there."""
    out: dict[str, set[str]] = {path: {json_type(value)}}
    children: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        children = [(f"{path}.{key}", item) for key, item in value.items()]
    elif isinstance(value, list):
        children = [(f"{path}[]", item) for item in value]
    for child_path, item in children:
        for key, types in structure(item, child_path).items():
            out.setdefault(key, set()).update(types)
    return out


def missing_from(ours: dict[str, set[str]], theirs: dict[str, set[str]],
                 nullable: frozenset[str] = frozenset()) -> list[str]:
    """Paths of ``theirs`` that ``ours`` lacks or types differently (``nullable`` paths may be
    null on one side and a value on the other, as the spec allows)."""
    problems = []
    for path, types in sorted(theirs.items()):
        if path not in ours:
            problems.append(f"{path} missing")
        elif ours[path] != types and not (path in nullable
                                         and len((ours[path] | types) - {"null"}) <= 1):
            problems.append(f"{path}: {sorted(ours[path])} where recorded {sorted(types)}")
    return problems


class Sleeps(list):
    """``time.sleep`` stand-in recording each wait (the SDKs' retry waits) without waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
