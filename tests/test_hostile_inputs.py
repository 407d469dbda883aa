"""Hostile bodies and strings get a 4xx problem+json naming the field, never a 5xx, and write nothing.

Covers every operation that takes a body (POST /v1/jobs, POST /v1/webhooks) and the string
parameters of the others: nesting past max_json_depth, control characters and lone surrogates in
every string field, bodies that are not UTF-8, duplicate keys, and secrets echoed in error bodies.
The property-based tests run a bounded number of examples (the file takes well under a minute).
"""

from __future__ import annotations

import base64
import json
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from models import IdempotencyKey, Job
from models.webhook import WebhookEndpoint

HOOK_URL = "http://127.0.0.1:9/hook"  # private targets are allowed for these apps
JOB = {
    "prompt": "a fox in the snow",
    "modality": "text",
    "metadata": {"user": "ada"},
    "webhook": {"url": HOOK_URL, "events": ["job.succeeded"]},
}
ENDPOINT = {"url": HOOK_URL, "description": "ops pager", "events": ["job.succeeded"]}
BODIES = {"/v1/jobs": JOB, "/v1/webhooks": ENDPOINT}
# Every string field stored as given, by operation (the prompt is normalised instead: see below).
STRING_FIELDS = {
    "/v1/jobs": [("metadata", "user"), ("metadata", "[key]"), ("webhook", "url")],
    "/v1/webhooks": [("url",), ("description",)],
}
EXAMPLES = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,  # the same inputs each run: a failure reproduces
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def hostile_app(settings, sessions, broker, api_key):
    from app import create_app
    from tests.support.api import authed_client_class

    # Private webhook targets allowed, so a bad character is the only fault; a rate limit the
    # examples cannot reach.
    flask_app = create_app(
        settings.model_copy(update={"webhook_allow_private": True, "plan_rate_limit": "100000/second"})
    )
    flask_app.testing = True
    flask_app.test_client_class = authed_client_class(api_key)
    yield flask_app
    flask_app.extensions["genqueue"].engine.dispose()


@pytest.fixture
def api(hostile_app) -> FlaskClient:
    return hostile_app.test_client()


@pytest.fixture
def written(sessions) -> Callable[[], int]:
    """Rows any accepted request would have written: jobs, endpoints, idempotency keys."""

    def count() -> int:
        with sessions() as s:
            return sum(
                s.scalar(select(func.count()).select_from(model)) or 0
                for model in (Job, WebhookEndpoint, IdempotencyKey)
            )

    return count


def post(client: FlaskClient, path: str, data: bytes | str, **kw: Any) -> Any:
    kw.setdefault("content_type", "application/json")
    return client.post(path, data=data, **kw)


def refused(resp: Any, status: int, field: str | None = None) -> dict[str, Any]:
    """A 4xx problem+json with the status given and, if asked, the field named."""
    assert resp.status_code == status, (resp.status_code, resp.get_data(as_text=True)[:500])
    assert resp.mimetype == "application/problem+json"
    problem = resp.get_json()
    assert problem["status"] == status and problem["errors"], problem
    if field is not None:
        assert field in [e["field"] for e in problem["errors"]], problem
    return problem


# --- the valid bodies are accepted: each refusal below is caused by its one fault -------------


@pytest.mark.parametrize("path", list(BODIES))
def test_the_valid_bodies_are_accepted(api, path):
    resp = post(api, path, json.dumps(BODIES[path]))
    assert resp.status_code in (201, 202), resp.get_data(as_text=True)


# --- nesting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("depth", [33, 1000, 30000])
def test_deep_nesting_is_400_before_decoding(api, written, path, depth):
    deep = "[" * depth + "]" * depth
    body = json.dumps({**BODIES[path], "extra": "X"}).replace('"X"', deep)
    refused(post(api, path, body), 400, "body")
    assert written() == 0


@pytest.mark.parametrize("raw", ["[" * 30000, '{"a":' * 12000, "[" * 20 + "]" * 21, '["\\"]' + "[" * 900])
def test_unbalanced_brackets_are_400_without_recursing(api, written, raw):
    refused(post(api, "/v1/jobs", raw), 400, "body")
    assert written() == 0


def test_nesting_up_to_the_limit_is_decoded(api, written, settings):
    # 32 levels pass the depth check and reach the schema (metadata values must be strings).
    inner = "[" * (settings.max_json_depth - 2) + "]" * (settings.max_json_depth - 2)
    body = json.dumps({**JOB, "metadata": {"user": "X"}}).replace('"X"', inner)
    refused(post(api, "/v1/jobs", body), 422, "metadata.user")
    assert written() == 0


def test_brackets_inside_strings_do_not_count(api):
    resp = post(api, "/v1/jobs", json.dumps({**JOB, "prompt": "[" * 3000 + '\\"{' * 100}))
    assert resp.status_code == 202, resp.get_data(as_text=True)


# --- encodings --------------------------------------------------------------------------------

NOT_UTF8 = ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be", "latin-1", "cp1252"]


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("encoding", [*NOT_UTF8, "utf-8-sig"])
def test_a_body_that_is_not_plain_utf8_is_400(api, written, path, encoding):
    body = {**BODIES[path], "metadata": {"user": "caf\u00e9"}} if path == "/v1/jobs" else BODIES[path]
    if path == "/v1/webhooks":
        body = {**body, "description": "caf\u00e9"}
    refused(post(api, path, json.dumps(body, ensure_ascii=False).encode(encoding)), 400, "body")
    assert written() == 0


def test_a_charset_other_than_utf8_is_415(api, written):
    raw = json.dumps(JOB).encode("utf-16")
    refused(post(api, "/v1/jobs", raw, content_type="application/json; charset=utf-16"), 415, "body")
    resp = post(api, "/v1/jobs", json.dumps(JOB), content_type="application/json; charset=UTF-8")
    assert resp.status_code == 202


# --- duplicate keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('{"prompt": "a", "modality": "text", "prompt": "b"}', "prompt"),
        ('{"prompt": "a", "modality": "text", "metadata": {"k": "1", "k": "2"}}', "metadata.k"),
        ('{"prompt": "a", "modality": "text", "webhook": {"url": "h", "url": "h"}}', "webhook.url"),
    ],
)  # fmt: skip
def test_duplicate_keys_are_400_naming_the_key(api, written, raw, field):
    problem = refused(post(api, "/v1/jobs", raw), 400, field)
    assert problem["errors"][0]["message"] == "duplicate key"
    assert written() == 0


def test_duplicate_endpoint_key_is_400(api, written):
    raw = f'{{"url": "{HOOK_URL}", "description": "a", "description": "b"}}'
    refused(post(api, "/v1/webhooks", raw), 400, "description")
    assert written() == 0


def _names_the_char(message: str) -> bool:
    # Ours names the character; pydantic's own strict str refuses a lone surrogate first.
    return "must not contain" in message or "unicode string" in message


# --- control characters: the reported 500s ----------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/webhooks", {**ENDPOINT, "url": HOOK_URL + "\x00"}, "url"),
        ("/v1/webhooks", {**ENDPOINT, "description": "a\x00b"}, "description"),
        ("/v1/jobs", {**JOB, "webhook": {"url": HOOK_URL + "\x00"}}, "webhook.url"),
        ("/v1/jobs", {**JOB, "webhook": {"url": HOOK_URL + "\ud800"}}, "webhook.url"),
        ("/v1/webhooks", {**ENDPOINT, "description": "\udfff"}, "description"),
    ],
)
def test_nul_and_surrogates_are_422_naming_the_field(api, written, path, body, field):
    problem = refused(post(api, path, json.dumps(body)), 422, field)
    assert _names_the_char(problem["errors"][0]["message"]), problem
    assert written() == 0


def test_nul_in_idempotency_key_is_422(api, written):
    refused(post(api, "/v1/jobs", json.dumps(JOB), headers={"Idempotency-Key": "k\x00"}), 422)
    assert written() == 0


# --- secrets are never echoed -----------------------------------------------------------------


def test_error_bodies_never_echo_an_api_key(api, api_key):
    secret = api_key.split("_", 2)[2]
    answers = [
        api.get(f"/v1/jobs/{api_key}"),
        api.post(f"/v1/jobs/{api_key}/cancel"),
        api.get(f"/v1/jobs/{api_key}/content"),
        api.delete(f"/v1/webhooks/{api_key}"),
        api.post(f"/v1/webhook-deliveries/{api_key}/redeliver"),
        post(api, "/v1/jobs", json.dumps({**JOB, api_key: 1})),
        post(api, "/v1/jobs", json.dumps({**JOB, "params": {api_key: 1}})),
        post(api, "/v1/jobs", json.dumps({**JOB, "metadata": {api_key + "\x00": "v"}})),
        post(api, "/v1/webhooks", json.dumps({**ENDPOINT, api_key: "x"})),
        post(api, "/v1/webhooks", json.dumps({**ENDPOINT, "url": f"ftp://{api_key}@example.com/"})),
        post(api, "/v1/jobs", f'{{"{api_key}": 1, "{api_key}": 2}}'),
    ]
    for resp in answers:
        assert 400 <= resp.status_code < 500, resp.get_data(as_text=True)
        text = resp.get_data(as_text=True)
        assert secret not in text, text
        # A 404 that names the id names it masked (the prefix); a routing 404 (a non-UUID where
        # the route takes a UUID, e.g. DELETE /v1/webhooks/<id>) names nothing at all.
        routing_404 = resp.status_code == 404 and "requested URL was not found" in text
        assert api_key[:11] in text or resp.status_code != 404 or routing_404


# --- property-based: every operation, every string field --------------------------------------

# Characters no stored string may hold: C0/C1 controls (NUL among them) and lone surrogates.
BAD_CHARS = st.one_of(
    st.characters(codec=None, categories=["Cc"]),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
)
ANY_CHAR = st.characters(codec="utf-8", exclude_categories=["Cs"]) | BAD_CHARS


def _set(body: dict[str, Any], where: tuple[str, ...], value: str) -> dict[str, Any]:
    body = json.loads(json.dumps(body))
    parent = body
    for name in where[:-1]:
        parent = parent[name]
    if where[-1] == "[key]":  # a mapping key: replace the mapping's only key
        parent.clear()
        parent[value] = "v"
    else:
        parent[where[-1]] = value
    return body


def _field(where: tuple[str, ...]) -> str:
    return ".".join(where[:-1]) if where[-1] == "[key]" else ".".join(where)


@st.composite
def with_bad_char(draw: st.DrawFn, base: str) -> str:
    char = draw(BAD_CHARS)
    at = draw(st.integers(0, len(base)))
    return base[:at] + char + base[at:]


OPERATIONS = st.sampled_from(sorted(BODIES))


@given(data=st.data())
@EXAMPLES
def test_property_control_characters_in_every_string_field(api, written, data):
    path = data.draw(OPERATIONS)
    where = data.draw(st.sampled_from(STRING_FIELDS[path]))
    base = {"url": HOOK_URL, "[key]": "user"}.get(where[-1], "plain text")
    body = _set(BODIES[path], where, data.draw(with_bad_char(base)))
    problem = refused(post(api, path, json.dumps(body)), 422, _field(where))
    assert any(_names_the_char(e["message"]) for e in problem["errors"]), problem
    assert written() == 0


@given(prompt=st.text(ANY_CHAR, max_size=60))
@EXAMPLES
def test_property_the_prompt_is_stored_without_control_characters(api, sessions, prompt):
    # Documented: the prompt is normalised (controls other than tab and newline removed), not refused.
    resp = post(api, "/v1/jobs", json.dumps({**JOB, "prompt": prompt}))
    assert resp.status_code in (202, 422), resp.get_data(as_text=True)
    if resp.status_code == 422:
        refused(resp, 422, "prompt")
        return
    with sessions() as s:
        stored = s.get(Job, resp.get_json()["id"]).prompt
    assert stored.strip() and all(c in "\t\n" or unicodedata.category(c) not in ("Cc", "Cs") for c in stored)


def _dumps_with_duplicate(value: Any, target: tuple[str, ...], here: tuple[str, ...] = ()) -> str:
    """JSON text of `value` in which the object at `target` repeats its first key."""
    if isinstance(value, dict):
        pairs = [json.dumps(k) + ":" + _dumps_with_duplicate(v, target, (*here, k)) for k, v in value.items()]
        if here == target:
            pairs.append(json.dumps(next(iter(value))) + ':"again"')
        return "{" + ",".join(pairs) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dumps_with_duplicate(v, target, here) for v in value) + "]"
    return json.dumps(value)


def _objects(value: Any, here: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(value, dict):
        yield here
        for k, v in value.items():
            yield from _objects(v, (*here, k))


@given(data=st.data())
@EXAMPLES
def test_property_nesting_encodings_and_duplicate_keys(api, written, data):
    path = data.draw(OPERATIONS)
    body = BODIES[path]
    fault = data.draw(st.sampled_from(["nesting", "encoding", "duplicate"]))
    if fault == "nesting":
        opener, closer = data.draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        depth = data.draw(st.integers(33, 60000 // len(opener + closer)))  # the body stays under 64 KiB
        text = json.dumps({**body, "extra": "X"}).replace('"X"', opener * depth + "1" + closer * depth)
        raw, field = text.encode(), "body"
    elif fault == "encoding":
        encoding = data.draw(st.sampled_from([*NOT_UTF8, "utf-8-sig"]))
        accented = {**body, "metadata": {"k": "\u00e9t\u00e9"}} if path == "/v1/jobs" else body
        if path == "/v1/webhooks":
            accented = {**body, "description": "\u00e9t\u00e9"}
        raw, field = json.dumps(accented, ensure_ascii=False).encode(encoding), "body"
    else:
        target = data.draw(st.sampled_from(list(_objects(body))))
        raw = _dumps_with_duplicate(body, target).encode()
        parent = body
        for name in target:
            parent = parent[name]
        field = ".".join([*target, next(iter(parent))])
    assert len(raw) <= 64 * 1024
    refused(post(api, path, raw), 400, field)
    assert written() == 0


PARAM_TEXT = st.text(ANY_CHAR, min_size=1, max_size=40)


@given(data=st.data())
@EXAMPLES
def test_property_string_parameters_never_5xx(api, written, data):
    value = data.draw(PARAM_TEXT)
    raw = quote(value.encode("utf-8", "surrogatepass"), safe="")
    url = data.draw(
        st.sampled_from(
            [
                f"/v1/jobs/{raw}",
                f"/v1/jobs/{raw}/cancel",
                f"/v1/jobs/{raw}/content",
                f"/v1/jobs/{raw}/webhook-deliveries",
                f"/v1/webhooks/{raw}",
                f"/v1/webhook-deliveries/{raw}/redeliver",
                f"/v1/jobs?status={raw}",
                f"/v1/jobs?cursor={raw}",
                f"/v1/jobs?limit={raw}",
            ]
        )
    )
    method = "GET" if url.startswith("/v1/jobs") and not url.endswith("/cancel") else "POST"
    if url.startswith("/v1/webhooks/"):
        method = "DELETE"
    resp = api.open(url, method=method)
    assert resp.status_code < 500, (url, resp.get_data(as_text=True))
    if resp.status_code >= 400:
        assert resp.mimetype == "application/problem+json"
    assert written() == 0


def _cursor(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "forged",
    [["2020-01-01T00:00:00", 5], [1, 2], "x", {"a": 1}, [], ["2020-01-01", "not-a-uuid"],
     b"[" * 3000 + b"]" * 3000, b'["2020-01-01", "\\u0000"]', b"\xff\xfe["],
)  # fmt: skip
def test_a_forged_cursor_is_422(api, forged):
    refused(api.get(f"/v1/jobs?cursor={_cursor(forged)}"), 422, "cursor")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(ANY_CHAR, max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@given(value=st.lists(JSON_VALUES, min_size=0, max_size=3))
@EXAMPLES
def test_property_cursor_contents_never_5xx(api, value):
    resp = api.get(f"/v1/jobs?cursor={_cursor(value)}")
    assert resp.status_code in (200, 422), resp.get_data(as_text=True)


def test_the_prompt_drops_exactly_control_and_surrogate_characters() -> None:
    # app.schemas drops Unicode's Cc and Cs (but newline and tab) with one character class: checked
    # against the categories over every code point.
    import unicodedata

    from app.schemas import _DROPPED, _KEEP_CONTROL

    def dropped(c: str) -> bool:
        return c not in _KEEP_CONTROL and unicodedata.category(c) in ("Cc", "Cs")

    wrong = [hex(cp) for cp in range(0x110000) if bool(_DROPPED.match(chr(cp))) != dropped(chr(cp))]
    assert wrong == []
