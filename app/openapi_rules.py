"""Rules the request validators enforce that pydantic's JSON schemas leave out, stated in /openapi.json."""

from __future__ import annotations

from typing import Any

from app.schemas import ListQuery, UsageQuery
from models import catalog
from models.job import Modality
from models.settings import Settings
from tasks.contract.stages import model_stages

# Regexes are written with \\u escapes: ECMA-262 (the document's dialect) and Python's re read them
# alike. Lone surrogates (Cs, which the validators also refuse or remove) are left out of them: they
# are not Unicode scalar values, so not JSON Schema string content, and regex engines disagree on them.
# A prompt must keep a character after normalisation: neither a control character (Cc) nor
# whitespace (str.strip's set), as app.schemas.JobCreateBase._clean_prompt.
PROMPT_PATTERN = "[^\\u0000-\\u0020\\u007f-\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
# metadata keys and values: no control characters (JobCreateBase._storable).
NO_CONTROL_PATTERN = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
# models.ssrf.split_url: http or https (any case); a host: an ASCII name (an IDN as punycode) or a
# bracketed IPv6 literal (RFC 3986's IPv6address); no credentials; a port from 0 to 65535 if any
# (leading zeros allowed); then anything but a control character (app.body.StorableStr).
# Whether the host resolves to public addresses only is checked at submit and cannot be stated here.
_PORT = "0*(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4})"
_H16, _OCTET = "[0-9A-Fa-f]{1,4}", "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_LS32 = f"(?:{_H16}:{_H16}|{_OCTET}(?:\\.{_OCTET}){{3}})"
_IPV6 = "|".join(
    [f"(?:{_H16}:){{6}}{_LS32}", f"::(?:{_H16}:){{5}}{_LS32}", f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}"]
    + [f"(?:(?:{_H16}:){{0,{n - 1}}}{_H16})?::(?:{_H16}:){{{4 - n}}}{_LS32}" for n in (2, 3)]
    + [f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}", f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}"]
    + [f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}", f"(?:(?:{_H16}:){{0,6}}{_H16})?::"]
)
URL_HOST = f"(?:\\[(?:{_IPV6})\\]|[!$&'()*+,;=%A-Za-z0-9._~-]+)"
URL_SCHEME = "[Hh][Tt][Tt][Pp][Ss]?://"
URL_PATTERN = f"^{URL_SCHEME}{URL_HOST}(?::(?:{_PORT})?)?(?:[/?#][^\\u0000-\\u001f\\u007f-\\u009f]*)?$"
URL_NOTE = (
    " Checked at submit: every address the host resolves to must be public (no loopback, private,"
    " link-local or metadata address)."
)
INTEGERS_NOTE = "Integers are written without a fraction or exponent: 256, not 256.0 (a 422)."
# The cursor is unpadded URL-safe base64 (app.jobs._encode_cursor); only a `next_cursor` decodes.
CURSOR = {"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9_-]+$"}


def query_params() -> list[dict[str, Any]]:
    """GET /v1/jobs's query parameters from ListQuery. A query value is a string, never null, and
    an empty one is a 422 like any other invalid value, so each gets its bare string schema."""
    out: list[dict[str, Any]] = []
    for name, prop in ListQuery.model_json_schema()["properties"].items():
        schema = {k: v for k, v in prop.items() if k not in ("title", "anyOf", "description")}
        for alt in prop.get("anyOf", []):
            if alt.get("type") != "null":
                schema |= alt
        if schema.get("default", "") is None:
            del schema["default"]
        if name == "cursor":
            schema |= CURSOR
        doc = prop.get("description", "")
        out.append({"name": name, "in": "query", "required": False, "schema": schema, "description": doc})
    return out


def usage_params() -> list[dict[str, Any]]:
    """GET /v1/usage's query parameters from UsageQuery (each a plain string schema, as above)."""
    out: list[dict[str, Any]] = []
    for name, prop in UsageQuery.model_json_schema(by_alias=True)["properties"].items():
        schema = next(alt for alt in prop["anyOf"] if alt.get("type") != "null")
        doc = prop.get("description", "")
        if name in ("from", "to"):
            doc += " At most 366 days apart; `from` before `to` (else a 422 naming `to`)."
        out.append({"name": name, "in": "query", "required": False, "schema": schema, "description": doc})
    return out


def _alt(schema: dict[str, Any], kind: str) -> dict[str, Any]:
    """The `kind` alternative of an optional field's `anyOf [kind, null]`."""
    return next(s for s in schema.get("anyOf", [schema]) if s.get("type") == kind)


def _url(schema: dict[str, Any]) -> None:
    schema["pattern"] = URL_PATTERN
    schema["description"] = schema.get("description", "") + URL_NOTE


def tighten(schemas: dict[str, Any]) -> None:
    """Add the validators' rules to the named component schemas, in place."""
    for name in ("TextJobCreate", "VideoJobCreate", "ImageJobCreate", "StoryboardJobCreate"):
        props = schemas[name]["properties"]
        props["prompt"]["pattern"] = PROMPT_PATTERN
        props["prompt"]["description"] = (
            "Normalised first (NFC, CRLF to LF, control characters but tab and newline removed, trimmed); "
            "blank after that is a 422."
        )
        metadata = _alt(props["metadata"], "object")
        metadata["propertyNames"]["pattern"] = NO_CONTROL_PATTERN
        metadata["additionalProperties"]["pattern"] = NO_CONTROL_PATTERN
    # The models are strict: JSON has one number type, and to JSON Schema 256.0 is an integer.
    for name in ("TextParams", "VideoParams", "ImageParams", "StoryboardParams"):
        schemas[name]["description"] += " " + INTEGERS_NOTE
    # VideoParams._four_k_plus_one: JSON Schema has no "4k+1", so the values are listed.
    for name in ("VideoParams", "StoryboardParams"):
        frames = _alt(schemas[name]["properties"]["num_frames"], "integer")
        frames["enum"] = list(range(frames["minimum"], frames["maximum"] + 1, 4))
    for name in ("WebhookSubscription", "EndpointCreate"):
        _url(schemas[name]["properties"]["url"])
    _alt(schemas["EndpointCreate"]["properties"]["description"], "string")["pattern"] = NO_CONTROL_PATTERN


def model_choices(schemas: dict[str, Any], settings: Settings) -> None:
    """A job's `model` as the catalog allows it (app.model_choice): the configured ids of the job's
    own stages, listed, so a schema-valid request names no unknown model."""
    ids: dict[str, list[str]] = {}
    for m in catalog.configured(settings):
        ids.setdefault(m.stage, []).append(m.id)
    for schema in schemas.values():
        modality = schema.get("properties", {}).get("modality", {}).get("const")
        if modality not in set(Modality) or "model" not in schema["properties"]:
            continue
        stages = [str(s) for s in model_stages(modality)]
        prop = schema["properties"]["model"]
        one = {"type": "string", "enum": ids.get(stages[-1], []), "description": f"A {stages[-1]} model id."}
        each = {
            "type": "object",
            "properties": {s: {"type": "string", "enum": ids.get(s, [])} for s in stages},
            "additionalProperties": False,
        }
        schema["properties"]["model"] = {
            "anyOf": [one, each, {"type": "null"}],
            "default": None,
            "description": prop.get("description", ""),
        }
