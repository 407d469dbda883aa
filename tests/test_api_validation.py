"""Bad jobs get a problem+json naming the field and write nothing; so does every other failure."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from models import Job
from tests.support.api import assert_problem

VALID_VIDEO = {"prompt": "a red fox in the snow", "modality": "video"}
VALID_TEXT = {"prompt": "a haiku about queues", "modality": "text"}


@pytest.fixture
def reject(client, sessions):
    """POST a body; assert the status, problem+json, the named field and that no job row exists."""

    def check(body: Any, status: int, field: str, **kwargs: Any) -> dict[str, Any]:
        if "data" not in kwargs:  # json.dumps, not json=: a JSON null body must be sent too
            kwargs = {"data": json.dumps(body), "content_type": "application/json", **kwargs}
        resp = client.post("/v1/jobs", **kwargs)
        assert resp.status_code == status, resp.get_data(as_text=True)
        assert resp.mimetype == "application/problem+json"
        problem = resp.get_json()
        assert problem["status"] == status
        assert {"type", "title", "detail", "errors"} <= problem.keys()
        fields = [e["field"] for e in problem["errors"]]
        assert field in fields, problem
        with sessions() as s:
            assert s.scalar(select(func.count()).select_from(Job)) == 0
        return problem

    return check


def video(**params: Any) -> dict[str, Any]:
    return {**VALID_VIDEO, "params": params}


def text(**params: Any) -> dict[str, Any]:
    return {**VALID_TEXT, "params": params}


# --- prompt -----------------------------------------------------------------------------------


def test_prompt_missing(reject):
    reject({"modality": "video"}, 422, "prompt")


@pytest.mark.parametrize("blank", ["", "   ", "\n\t ", "\x00\x01\x7f"])
def test_prompt_blank(reject, blank):
    reject({**VALID_VIDEO, "prompt": blank}, 422, "prompt")


def test_prompt_too_long(reject):
    reject({**VALID_VIDEO, "prompt": "x" * 4001}, 422, "prompt")


def test_prompt_length_counts_after_trimming(client):
    resp = client.post("/v1/jobs", json={**VALID_TEXT, "prompt": "  " + "x" * 4000 + "  "})
    assert resp.status_code == 202, resp.get_data(as_text=True)
    assert resp.get_json()["prompt"] == "x" * 4000


@pytest.mark.parametrize("value", [123, None, ["a"], {"text": "a"}, True])
def test_prompt_wrong_type(reject, value):
    reject({**VALID_VIDEO, "prompt": value}, 422, "prompt")


# --- modality ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["audio", "VIDEO", "", 5, None])
def test_modality_unknown(reject, value):
    reject({"prompt": "p", "modality": value}, 422, "modality")


def test_modality_missing(reject):
    reject({"prompt": "p"}, 422, "modality")


# --- params -----------------------------------------------------------------------------------

OUT_OF_RANGE = [
    ("width", 48), ("width", 1040), ("width", 100), ("width", 0),
    ("height", 32), ("height", 2048), ("height", 250),
    ("num_frames", 0), ("num_frames", 125), ("num_frames", 16), ("num_frames", 18),
    ("fps", 0), ("fps", 61),
    ("steps", 0), ("steps", 101),
    ("seed", -1), ("seed", 2**32),
    ("max_new_tokens", 0), ("max_new_tokens", 513),
    ("temperature", -0.01), ("temperature", 2.01),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), OUT_OF_RANGE)
def test_video_param_out_of_range(reject, name, value):
    reject(video(**{name: value}), 422, f"params.{name}")


WRONG_TYPE = [
    ("width", "256"), ("width", 256.0), ("width", True),
    ("height", "256"), ("num_frames", 17.5), ("num_frames", "17"),
    ("fps", "8"), ("steps", [8]), ("seed", "42"), ("seed", 1.5),
    ("max_new_tokens", "64"), ("temperature", "0.5"), ("temperature", True),
    ("allow_degraded", "yes"), ("allow_degraded", 1),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), WRONG_TYPE)
def test_video_param_wrong_type(reject, name, value):
    reject(video(**{name: value}), 422, f"params.{name}")


@pytest.mark.parametrize(
    ("name", "value"), [("max_new_tokens", 0), ("max_new_tokens", 600), ("temperature", 3), ("seed", -5)]
)
def test_text_param_out_of_range(reject, name, value):
    reject(text(**{name: value}), 422, f"params.{name}")


@pytest.mark.parametrize("name", ["width", "height", "num_frames", "fps", "steps", "allow_degraded"])
def test_video_param_on_text_job(reject, name):
    value = {"allow_degraded": True}.get(name, 64 if name in ("width", "height") else 1)
    problem = reject(text(**{name: value}), 422, f"params.{name}")
    assert "video" in problem["errors"][0]["message"]


def test_unknown_param(reject):
    problem = reject(video(guidance_scale=7.5), 422, "params.guidance_scale")
    assert problem["errors"][0]["message"] == "unknown field"


def test_resolution_string_is_not_a_param(reject):
    # One clean design: width and height, not a "WxH" string.
    reject(video(resolution="256x256"), 422, "params.resolution")


@pytest.mark.parametrize("value", ["w=256", [256], 5])
def test_params_not_an_object(reject, value):
    reject({**VALID_VIDEO, "params": value}, 422, "params")


def test_every_bad_param_is_reported(reject):
    problem = reject(video(width=1, fps=0, steps="8"), 422, "params.width")
    assert {e["field"] for e in problem["errors"]} == {"params.width", "params.fps", "params.steps"}


# --- top level --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["webhook", "prompts", "Modality", "id"])
def test_unknown_top_level_field(reject, name):
    reject({**VALID_VIDEO, name: "x"}, 422, name)


@pytest.mark.parametrize("value", ["urgent", "HIGH", 1, ["high"]])
def test_priority_invalid(reject, value):
    reject({**VALID_VIDEO, "priority": value}, 422, "priority")


def test_metadata_too_many_keys(reject):
    reject({**VALID_VIDEO, "metadata": {f"k{i}": "v" for i in range(17)}}, 422, "metadata")


@pytest.mark.parametrize("key", ["k" * 257, ""])
def test_metadata_key_invalid(reject, key):
    problem = reject({**VALID_VIDEO, "metadata": {key: "v"}}, 422, "metadata")
    assert "key" in problem["errors"][0]["message"]


def test_metadata_value_too_long(reject):
    reject({**VALID_VIDEO, "metadata": {"user": "v" * 257}}, 422, "metadata.user")


@pytest.mark.parametrize("value", [1, None, ["a"], {"a": "b"}, True])
def test_metadata_value_not_a_string(reject, value):
    reject({**VALID_VIDEO, "metadata": {"user": value}}, 422, "metadata.user")


@pytest.mark.parametrize("value", ["tags", ["a"], 3])
def test_metadata_not_an_object(reject, value):
    reject({**VALID_VIDEO, "metadata": value}, 422, "metadata")


@pytest.mark.parametrize("char", ["\x00", "\x1b", "\n", "\x7f", "\x85", "\ud800"])
def test_metadata_control_characters(reject, char):
    problem = reject({**VALID_VIDEO, "metadata": {"user": f"a{char}b"}}, 422, "metadata.user")
    assert "must not contain" in problem["errors"][0]["message"]
    problem = reject({**VALID_VIDEO, "metadata": {f"a{char}b": "v"}}, 422, "metadata")
    assert "must not contain" in problem["errors"][0]["message"]


@pytest.mark.parametrize("body", [[VALID_VIDEO], "a fox", 42, None])
def test_body_not_an_object(reject, body):
    reject(body, 422, "body")


# --- transport: media type, syntax, size ------------------------------------------------------


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
def test_non_json_body_is_415(reject, content_type):
    kwargs: dict[str, Any] = {"data": '{"prompt": "p", "modality": "text"}'}
    if content_type:
        kwargs["content_type"] = content_type
    reject(None, 415, "body", **kwargs)


@pytest.mark.parametrize(
    "raw",
    [
        b"{", b'{"prompt": "p",}', b"", b"\xff\xfe{}", b'{"prompt": NaN}', b"{'a': 1}",
        b'{"prompt": "p", "modality": "text", "params": {"temperature": 1e999}}',
        '{"prompt": "p", "modality": "text"}'.encode("utf-16-le"),
        b"[" * 5000 + b"]" * 5000,
    ],
)  # fmt: skip
def test_unparseable_json_is_400(reject, raw):
    reject(None, 400, "body", data=raw, content_type="application/json")


def test_too_large_is_413(reject, settings):
    body = b'{"prompt": "' + b"x" * settings.max_body_bytes + b'", "modality": "text"}'
    reject(None, 413, "body", data=body, content_type="application/json")


def test_too_large_chunked_is_413(client, sessions, settings):
    # No Content-Length to check up front: werkzeug's MAX_CONTENT_LENGTH stops the read.
    body = io.BytesIO(b'{"prompt": "' + b"x" * (settings.max_body_bytes + 1) + b'"}')
    resp = client.post(
        "/v1/jobs",
        input_stream=body,
        content_type="application/json",
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},  # as gunicorn marks a chunked body
    )
    assert resp.status_code == 413
    assert resp.mimetype == "application/problem+json"


@pytest.mark.parametrize("chunked", [False, True])
def test_body_of_exactly_the_limit_is_accepted(client, settings, chunked):
    job = b'{"prompt": "p", "modality": "text"}'
    body = job + b" " * (settings.max_body_bytes - len(job))  # JSON allows trailing whitespace
    extra: dict[str, Any] = {"data": body}
    if chunked:
        extra = {
            "input_stream": io.BytesIO(body),
            "headers": {"Transfer-Encoding": "chunked"},
            "environ_overrides": {"wsgi.input_terminated": True},
        }
    resp = client.post("/v1/jobs", content_type="application/json", **extra)
    assert resp.status_code == 202, resp.get_data(as_text=True)


# --- every other failure renders as problem+json too ------------------------------------------


def test_unknown_route_and_wrong_method(client):
    assert_problem(client.get("/v1/nothing"), 404)
    resp = client.delete("/v1/jobs")
    assert_problem(resp, 405)
    assert "POST" in resp.headers["Allow"]


def test_unexpected_error_is_500_without_internals(app, caplog):
    def boom() -> None:
        raise RuntimeError("SELECT secret FROM /etc/passwd")

    app.add_url_rule("/boom", view_func=boom)
    resp = app.test_client().get("/boom")
    problem = assert_problem(resp, 500)
    text = resp.get_data(as_text=True)
    assert "secret" not in text and "/etc" not in text and "Traceback" not in text
    assert problem["title"] == "Internal Server Error"
    assert "SELECT secret" in caplog.text  # logged for the operator


def test_the_readmes_error_example_is_what_the_server_sends(client) -> None:
    """README.md shows one problem+json answer: its type, title and shape must be the real ones."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"name each bad field:\s*```json\n(.*?)```", readme, re.S)
    assert block, "README.md's problem+json example moved"
    shown = json.loads(block.group(1).replace('"..."', '"x"'))
    resp = client.post("/v1/jobs", json={"prompt": "p", "modality": "video", "params": {"width": 100}})
    real = assert_problem(resp, shown["status"])
    assert (real["type"], real["title"], real["detail"]) == (shown["type"], shown["title"], shown["detail"])
    assert shown["errors"][0]["field"] in [e["field"] for e in real["errors"]]
    assert set(shown) <= set(real)
