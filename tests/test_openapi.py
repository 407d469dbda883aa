"""The service surface: a valid OpenAPI 3.1 document of every route, /docs, /metrics and a light factory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import schemathesis
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from pydantic import ValidationError

from app import api_docs, openapi_rules
from app.schemas import TextJobCreate, VideoJobCreate, parse_job
from models import Job as JobRow
from models import JobStatus, ssrf
from models.db import transaction
from models.media_links import MediaSigner
from models.resource import Job, JobList, job_resource
from models.settings import Settings


@pytest.fixture
def spec(client):
    resp = client.get("/openapi.json")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    return resp.get_json()


def test_document_is_valid_openapi_3_1(spec):
    assert spec["openapi"].startswith("3.1")
    validate(spec)


def test_every_route_is_documented(app, spec):
    documented = {(path, method) for path, ops in spec["paths"].items() for method in ops}
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            assert (path, method.lower()) in documented, f"{method} {path} missing from /openapi.json"
    assert any(p.startswith("/v1/") for p, _ in documented)


def test_request_schema_comes_from_the_pydantic_models(spec):
    schemas = spec["components"]["schemas"]
    body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/JobCreate"}
    assert {TextJobCreate.__name__, VideoJobCreate.__name__, "VideoParams", "TextParams"} <= schemas.keys()
    video = schemas["VideoParams"]
    assert video["additionalProperties"] is False
    width = next(s for s in video["properties"]["width"]["anyOf"] if s.get("type") == "integer")
    assert (width["minimum"], width["maximum"], width["multipleOf"]) == (64, 1024, 16)
    assert schemas["JobCreate"]["discriminator"]["propertyName"] == "modality"


def test_every_error_response_is_problem_json(spec):
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for code, response in op["responses"].items():
                if int(code) >= 400:
                    assert "application/problem+json" in response["content"], (method, path, code)


@pytest.mark.parametrize("modality", ["video", "image"])
@pytest.mark.parametrize("status", list(JobStatus))
def test_job_resource_matches_its_documented_schema(status, modality):
    # Catches drift between models.resource.job_resource and the documented Job schema.
    row = JobRow(
        id=uuid.uuid4(), status=status, modality=modality, prompt="p", params={"num_images": 2},
        priority="normal", progress=0, attempts=1, meta={"k": "v"}, output_text="t",
        artifact_path="x/video.mp4" if modality == "video" else "x/image-0.png",
        error_code="boom" if status == JobStatus.FAILED else None, error_message="m", error_stage=modality,
    )  # fmt: skip
    signer = MediaSigner(("k",), 3600)
    resource = job_resource(row, "https://gq.example", 3, signer, "https://gq.example")
    Job.model_validate(resource)
    JobList.model_validate({"data": [resource], "next_cursor": None})
    images = resource["outputs"]["images"]
    if modality == "image" and status == JobStatus.SUCCEEDED:
        assert [i["index"] for i in images] == [0, 1] and images[1]["webp_signed_url"]
    else:
        assert images is None


def test_the_image_modality_is_documented(spec):
    schemas = spec["components"]["schemas"]
    assert set(schemas["JobCreate"]["discriminator"]["mapping"]) == {"text", "video", "image", "storyboard"}
    params = schemas["ImageParams"]["properties"]
    assert {"width", "height", "steps", "guidance", "seed", "num_images", "enhance_prompt"} <= params.keys()
    count = next(s for s in params["num_images"]["anyOf"] if s.get("type") == "integer")
    width = next(s for s in params["width"]["anyOf"] if s.get("type") == "integer")
    assert (count["minimum"], count["maximum"], width["multipleOf"]) == (1, 4, 32)
    content = {p["name"]: p for p in spec["paths"]["/v1/jobs/{job_id}/content"]["get"]["parameters"]}
    assert "image" in content["variant"]["schema"]["enum"]
    assert content["format"]["schema"]["enum"] == ["png", "webp"]
    assert "image/png" in spec["paths"]["/v1/jobs/{job_id}/content"]["get"]["responses"]["200"]["content"]
    assert "images" in schemas["JobOutputs"]["properties"]


def test_the_storyboard_modality_is_documented(spec):
    schemas = spec["components"]["schemas"]
    shots = next(
        s for s in schemas["StoryboardParams"]["properties"]["shots"]["anyOf"] if s.get("type") == "integer"
    )
    assert (shots["minimum"], shots["maximum"]) == (2, 12)
    content = {p["name"]: p for p in spec["paths"]["/v1/jobs/{job_id}/content"]["get"]["parameters"]}
    assert {"shot", "contact_sheet"} <= set(content["variant"]["schema"]["enum"])
    board = schemas["Storyboard"]["properties"]
    assert {"title", "parsed", "shots", "contact_sheet_url"} <= board.keys()
    assert "storyboard" in schemas["Job"]["properties"]


def test_docs_page_lists_the_endpoints_without_external_assets(client, spec):
    resp = client.get("/docs")
    assert resp.status_code == 200 and resp.mimetype == "text/html"
    html = resp.get_data(as_text=True)
    for path in spec["paths"]:  # the <noscript> list
        assert f"<code>{path}</code>" in html
    assert "http://" not in html and "https://" not in html and "//" not in html
    # Only scripts of our own, from files: nothing inline (a CSP of script-src 'self' allows it).
    assert re.findall(r"<script[^>]*>", html) == [
        f"<script src='docs/assets/{name}?v={api_docs.ui_version()}'>"
        for name in ("swagger-ui-bundle.js", "genqueue-docs.js")
    ]


def test_metrics_count_requests_and_submissions(client):
    client.post("/v1/jobs", json={"prompt": "a fox", "modality": "video"})
    client.get(f"/v1/jobs/{uuid.uuid4()}")
    text = client.get("/metrics").get_data(as_text=True)
    assert 'genqueue_jobs_submitted_total{modality="video"} 1.0' in text
    assert 'genqueue_http_requests_total{endpoint="/v1/jobs",method="POST",status="202"} 1.0' in text
    assert 'endpoint="/v1/jobs/<job_id>",method="GET",status="404"' in text
    assert "genqueue_http_request_duration_seconds_bucket" in text


# --- app factory and metrics across processes ----------------------------------------

FACTORY_SCRIPT = """
import json, sys
from app import create_app
app = create_app({"database_url": sys.argv[1], "broker_url": sys.argv[2], "TESTING": True})
client = app.test_client()
client.get("/v1/health")
heavy = ("torch", "numpy", "diffusers", "transformers", "tasks.pipeline")
print(json.dumps({"heavy": [m for m in heavy if m in sys.modules], "testing": app.config["TESTING"],
                  "metrics": client.get("/metrics").get_data(as_text=True)}))
"""


def test_factory_is_light_and_metrics_are_multiprocess_safe(settings, tmp_path):
    # A fresh interpreter: this one has imported the pipeline for the worker fixture.
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(root)}
    args = [sys.executable, "-c", FACTORY_SCRIPT, settings.database_url, settings.broker_url]
    out = json.loads(subprocess.run(args, env=env, capture_output=True, check=True, text=True).stdout)
    assert out["heavy"] == [] and out["testing"] is True
    assert (
        'genqueue_http_requests_total{endpoint="/v1/health",method="GET",status="200"} 1.0' in out["metrics"]
    )
    assert list(tmp_path.glob("*.db"))  # values went through the multiprocess files


# --- the document matches the API's answers ----------------------------------------------------


def _url(path: str) -> str:
    return re.sub(r"\{[^{}]+\}", str(uuid.uuid4()), path)  # any id: routing and auth come first


@pytest.fixture
def documented(spec):
    """documented(method, path, response): the status is documented and the answer conforms to it."""
    schema = schemathesis.openapi.from_dict(spec)

    def check(method: str, path: str, resp) -> dict:
        declared = spec["paths"][path][method.lower()]["responses"].get(str(resp.status_code))
        assert declared is not None, f"{resp.status_code} is not documented for {method} {path}"
        schema[path][method].validate_response(resp)  # content type, headers, body schema
        return declared

    return check


def test_security_is_as_declared(anon_client, spec):
    """An operation that declares bearerAuth answers 401 without a key (documented); one that
    declares `security: []` does not ask for one."""
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            resp = anon_client.open(_url(path), method=method.upper())
            if op["security"]:
                assert resp.status_code == 401 and "401" in op["responses"], (method, path, resp.status_code)
            else:
                assert resp.status_code != 401, (method, path)


def test_allow_lists_exactly_the_documented_methods(client, spec):
    for path, ops in spec["paths"].items():
        resp = client.options(_url(path))
        allowed = {m.strip().lower() for m in resp.headers["Allow"].split(",")} - {"head", "options"}
        assert allowed == set(ops), (path, resp.headers["Allow"])
    # /v1/webhooks/secret is not an endpoint id: DELETE is not a method of it.
    assert client.delete("/v1/webhooks/secret").status_code == 405


def _finish(sessions, job_id: str) -> None:
    with transaction(sessions) as s:
        job = s.get(JobRow, uuid.UUID(job_id))
        job.status, job.output_text, job.progress = JobStatus.SUCCEEDED, "done", 100


def test_submit_answers_as_documented(client, sessions, documented):
    """202 when queued; the Idempotency-Key replay of a job that has finished since is a 200."""
    body, key = {"prompt": "a fox", "modality": "text"}, {"Idempotency-Key": "doc-200"}
    first = client.post("/v1/jobs", json=body, headers=key)
    assert first.status_code == 202
    documented("POST", "/v1/jobs", first)
    _finish(sessions, first.get_json()["id"])
    replay = client.post("/v1/jobs", json=body, headers=key)
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.get_json()["status"] == "succeeded"
    assert "Idempotent-Replayed" in documented("POST", "/v1/jobs", replay)["headers"]


def test_integral_floats_are_refused_as_documented(client, spec):
    # JSON Schema's `integer` takes 7.0; the strict models do not, and the document says so.
    resp = client.post("/v1/jobs", json={"prompt": "p", "modality": "text", "params": {"seed": 7.0}})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["field"] == "params.seed"
    for name in ("TextParams", "VideoParams"):
        assert openapi_rules.INTEGERS_NOTE in spec["components"]["schemas"][name]["description"]


def test_unsatisfiable_range_is_documented(client, sessions, settings, documented):
    job_id = uuid.uuid4()
    folder = Path(settings.artifact_dir) / str(job_id)
    folder.mkdir(parents=True)
    (folder / "video.mp4").write_bytes(b"\x00" * 100)
    with transaction(sessions) as s:
        s.add(JobRow(id=job_id, modality="video", prompt="p", params={}, status=JobStatus.SUCCEEDED,
                     artifact_path=f"{job_id}/video.mp4", artifact_bytes=100))  # fmt: skip
    resp = client.get(f"/v1/jobs/{job_id}/content", headers={"Range": "bytes=500-"})
    assert resp.status_code == 416 and resp.mimetype == "application/problem+json"
    assert resp.headers["Content-Range"] == "bytes */100"
    assert "Content-Range" in documented("GET", "/v1/jobs/{job_id}/content", resp)["headers"]


@pytest.mark.parametrize(
    ("query", "field"),
    [("?cursor=", "cursor"), ("?status=", "status"), ("?limit=", "limit"), ("/content?variant=", "variant")],
)
def test_an_empty_query_value_is_invalid_as_documented(client, sessions, spec, query, field):
    """One rule for every query parameter: empty is a 422 naming it, never the default."""
    with transaction(sessions) as s:
        job = JobRow(id=uuid.uuid4(), modality="text", prompt="p", params={}, output_text="t")
        s.add(job)
    path = f"/v1/jobs/{job.id}/content" if field == "variant" else "/v1/jobs"
    resp = client.get(path + query.removeprefix("/content"))
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["field"] == field, resp.get_json()
    op = spec["paths"]["/v1/jobs/{job_id}/content" if field == "variant" else "/v1/jobs"]["get"]
    schema = next(p["schema"] for p in op["parameters"] if p["name"] == field)
    # A query value is a string on the wire: "" must be outside the parameter's schema too.
    assert not Draft202012Validator(schema).is_valid("") or schema.get("type") == "integer"


@given(text=st.text(max_size=20))
@examples(max_examples=400, deadline=None)
def test_prompt_and_metadata_patterns_agree_with_the_validators(text: str) -> None:
    """The document's patterns (app.openapi_rules) state what the validators do, character by character."""
    base = {"modality": "text", "prompt": text}
    assert _accepted(base) == bool(re.search(openapi_rules.PROMPT_PATTERN, text)), repr(text)
    meta = {"modality": "text", "prompt": "p", "metadata": {"k": text}}
    assert _accepted(meta) == bool(re.fullmatch(openapi_rules.NO_CONTROL_PATTERN, text)), repr(text)


def _accepted(body: dict) -> bool:
    try:
        parse_job(body, Settings())
    except ValidationError:
        return False
    return True


@given(url=st.from_regex(openapi_rules.URL_PATTERN, fullmatch=True))
@examples(max_examples=300, deadline=None)
def test_a_url_the_document_allows_passes_the_syntax_check(url: str) -> None:
    """Whatever matches the document's URL pattern is a URL models.ssrf takes apart without
    complaint; only where its host resolves to is left for the check at submit."""
    if len(url) <= ssrf.MAX_URL_CHARS:
        scheme, host, _ = ssrf.split_url(url)
        assert scheme in ("http", "https") and host
