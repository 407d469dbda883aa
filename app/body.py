"""Strict JSON request bodies: UTF-8 only, bounded nesting, unique keys, storable strings.

Flask's get_json (and json.loads on bytes) guesses UTF-16/UTF-32, keeps the last of duplicate
keys and recurses once per nesting level (RecursionError near 1000); every one of those is
refused here with a 400 naming the body, or the duplicated key.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Annotated, Any

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from app.errors import BadRequest

# A string literal, escapes included; brackets inside strings do not nest anything.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")
# Cc: C0 and C1 controls (NUL cannot be stored by Postgres at all); Cs: lone surrogates, which
# "\ud800" escapes produce and no encoding can write.
_UNSTORABLE = ("Cc", "Cs")


def _errors(field: str, message: str) -> list[dict[str, str]]:
    return [{"field": field, "message": message}]


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in a JSON text, counted without recursing."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


class _Duplicate(Exception):
    pass


def _path_of(node: Any, target: int, path: list[str]) -> list[str] | None:
    """The dotted path to the object whose id is `target` (bounded by the depth check)."""
    if id(node) == target:
        return path
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if isinstance(value, dict | list) and (found := _path_of(value, target, [*path, str(key)])):
            return found
    return None


def _finite(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999 would become inf
        raise ValueError(f"number {literal[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse(raw: bytes, max_depth: int) -> Any:
    """Decode a request body; BadRequest (400) for anything that is not strict UTF-8 JSON."""
    try:
        text = raw.decode("utf-8")  # strict: UTF-16/32 and stray bytes are errors, not guesses
    except UnicodeDecodeError as exc:
        raise BadRequest(
            "The body must be UTF-8 encoded JSON.", errors=_errors("body", f"not UTF-8 at byte {exc.start}")
        ) from None
    if nesting_depth(text) > max_depth:
        raise BadRequest(
            f"The body nests arrays and objects deeper than {max_depth} levels.",
            errors=_errors("body", f"nested deeper than {max_depth} levels"),
        )
    duplicates: list[tuple[int, str]] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, value in pairs:
            if key in obj and not duplicates:
                duplicates.append((id(obj), key))
            obj[key] = value
        return obj

    try:
        body = json.loads(text, object_pairs_hook=unique, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as exc:  # RecursionError: only if max_depth is set huge
        raise BadRequest("The body is not valid JSON.", errors=_errors("body", str(exc)[:200])) from None
    if duplicates:
        target, key = duplicates[0]
        field = ".".join([*(_path_of(body, target, []) or []), key])
        raise BadRequest(
            "The body repeats a key; each key may appear once per object.",
            errors=_errors(field, "duplicate key"),
        )
    return body


def unstorable(text: str, keep: str = "") -> str | None:
    """Why `text` may not be stored (a control character or lone surrogate), or None."""
    for char in text:
        if char not in keep and unicodedata.category(char) in _UNSTORABLE:
            kind = "a lone surrogate" if unicodedata.category(char) == "Cs" else "a control character"
            return f"must not contain {kind} (U+{ord(char):04X})"
    return None


def _storable(value: str) -> str:
    if (why := unstorable(value)) is not None:
        raise PydanticCustomError("unstorable", why)
    return value


# A string field stored as given (URL, description, metadata): no control characters at all.
StorableStr = Annotated[str, AfterValidator(_storable)]
