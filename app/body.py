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

from flask import request
from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from app.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from app.services import services

# A string literal, escapes included; brackets inside strings do not nest anything.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # unrolled: one pass per literal
# bytes.translate: "{}" become "[]", every other byte goes (UTF-8 sequences hold no ASCII bytes).
_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
# Cc: C0 and C1 controls (NUL cannot be stored by Postgres at all); Cs: lone surrogates, which
# "\ud800" escapes produce and no encoding can write.
_UNSTORABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # exactly categories Cc and Cs


def _errors(field: str, message: str) -> list[dict[str, str]]:
    return [{"field": field, "message": message}]


def nesting_depth(raw: bytes, limit: int) -> int | None:
    """How deep arrays and objects nest (limit + 1 when deeper), or None if brackets are unbalanced.

    Counted without recursing, at C speed: with string literals cut out, each pass of
    bytes.replace removes one level of innermost pairs, so a body needs `depth` passes.
    """
    brackets = _STRING.sub(b"", raw).translate(_TO_SQUARE, _NOT_BRACKET)
    if b"[" * (limit + 1) in brackets:  # the usual attack: one long run of openers
        return limit + 1
    depth = 0
    while b"[]" in brackets:
        depth += 1
        if depth > limit:
            return depth
        brackets = brackets.replace(b"[]", b"")
    return depth if not brackets else None  # valid JSON leaves nothing: its strings all close


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
    # No more brackets than the limit cannot nest past it (the usual body): no scan needed.
    few = raw.count(b"[") + raw.count(b"{") <= max_depth
    depth = 0 if few else nesting_depth(raw, max_depth)
    if depth is None:  # json.loads would recurse into every unclosed bracket before failing
        raise BadRequest("The body is not valid JSON.", errors=_errors("body", "unbalanced brackets"))
    if depth > max_depth:
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
        field = ".".join([*(_path_of(body, target, []) or []), key])[:200]
        raise BadRequest(
            "The body repeats a key; each key may appear once per object.",
            errors=_errors(field, "duplicate key"),
        )
    return body


def unstorable(text: str) -> str | None:
    """Why `text` may not be stored (a control character or lone surrogate), or None."""
    if (found := _UNSTORABLE.search(text)) is None:
        return None
    char = found.group()
    kind = "a lone surrogate" if unicodedata.category(char) == "Cs" else "a control character"
    return f"must not contain {kind} (U+{ord(char):04X})"


def _storable(value: str) -> str:
    if (why := unstorable(value)) is not None:
        raise PydanticCustomError("unstorable", why)
    return value


# A string field stored as given (URL, description, metadata): no control characters at all.
StorableStr = Annotated[str, AfterValidator(_storable)]


def _body(message: str) -> list[dict[str, str]]:
    return [{"field": "body", "message": message}]


def json_body(limit: int | None = None) -> Any:
    """The request's body as strict JSON: a JSON media type, UTF-8, at most `limit` (default:
    max_body_bytes) bytes."""
    if limit is None:
        limit = services().settings.max_body_bytes
    else:
        request.max_content_length = limit + 1  # the app-wide cap is max_body_bytes (app.factory)
    too_large = PayloadTooLarge(
        f"The body must be at most {limit} bytes.", errors=_body(f"over {limit} bytes")
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    mime = request.mimetype
    if mime != "application/json" and not (mime.startswith("application/") and mime.endswith("+json")):
        raise UnsupportedMediaType(
            "The body must be JSON (Content-Type: application/json).",
            errors=_body(f"Content-Type is {mime or 'missing'}"),
        )
    charset = request.mimetype_params.get("charset", "utf-8").lower()
    if charset not in ("utf-8", "utf8"):  # JSON is UTF-8 (RFC 8259 8.1); nothing else is decoded
        raise UnsupportedMediaType(
            "The body must be UTF-8 encoded JSON.", errors=_body(f"charset is {charset[:40]}")
        )
    raw = request.get_data(cache=False)  # MAX_CONTENT_LENGTH (limit + 1) bounds chunked bodies
    if len(raw) > limit:
        raise too_large
    return parse(raw, services().settings.max_json_depth)
