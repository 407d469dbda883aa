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
from openapi_spec_validator import validate

from app.openapi import Job, JobList
from app.schemas import TextJobCreate, VideoJobCreate
from models import Job as JobRow
from models import JobStatus
from models.resource import job_resource


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


@pytest.mark.parametrize("status", list(JobStatus))
def test_job_resource_matches_its_documented_schema(status):
    # Catches drift between models.resource.job_resource and the documented Job schema.
    row = JobRow(
        id=uuid.uuid4(), status=status, modality="video", prompt="p", params={"w": 1}, priority="normal",
        progress=0, attempts=1, meta={"k": "v"}, output_text="t", artifact_path="x/video.mp4",
        error_code="boom" if status == JobStatus.FAILED else None, error_message="m", error_stage="video",
    )  # fmt: skip
    resource = job_resource(row, "https://gq.example", 3)
    Job.model_validate(resource)
    JobList.model_validate({"data": [resource], "next_cursor": None})


def test_docs_page_lists_the_endpoints_without_external_assets(client, spec):
    resp = client.get("/docs")
    assert resp.status_code == 200 and resp.mimetype == "text/html"
    html = resp.get_data(as_text=True)
    for path in spec["paths"]:
        assert f"<code>{path}</code>" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html


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
