"""Real answers conform to /openapi.json's schemas, and those schemas are closed: a field an
answer carries that the document lacks fails here (the models serialize, so it cannot today)."""

from __future__ import annotations

import socket
import uuid
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from sqlalchemy import select

from app.openapi import RESPONSES
from models.db import transaction
from models.webhook import WebhookAttempt, WebhookDelivery
from tasks.webhooks import fan_out

HOOK_HOST = "hooks.test"  # .test never resolves for real; resolved here to a public-looking address
PUBLIC_LOOKING = "93.184.215.14"


@pytest.fixture
def spec(client) -> dict[str, Any]:
    return client.get("/openapi.json").get_json()


@pytest.fixture
def conforms(spec):
    """conforms(name, body): `body` validates against components/schemas/<name>, refs resolved."""
    registry = Registry().with_resource("urn:doc", DRAFT202012.create_resource(spec))

    def check(name: str, body: Any) -> None:
        schema = {"$ref": f"urn:doc#/components/schemas/{name}"}
        validator = Draft202012Validator(schema, registry=registry)
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]
        assert not errors, (name, errors, body)

    return check


@pytest.fixture
def public_hook_host(monkeypatch) -> None:
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == HOOK_HOST:
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (PUBLIC_LOOKING, port or 0))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def _objects(schema: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """Every object schema with declared properties inside `schema`."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        if "properties" in schema:
            found.append((where, schema))
        for key, value in schema.items():
            found += _objects(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            found += _objects(value, f"{where}/{i}")
    return found


def test_response_schemas_are_closed(spec) -> None:
    """Without additionalProperties: false an undocumented field would validate: every answer's
    object schema is closed, but the problem's (RFC 9457 extension members are allowed)."""
    schemas = spec["components"]["schemas"]
    names = {m.__name__ for m in RESPONSES}
    nested = {r.rsplit("/", 1)[-1] for n in names for r in _refs(schemas[n])}
    for name in sorted((names | nested) - {"Problem"}):
        for where, obj in _objects(schemas[name], name):
            assert obj.get("additionalProperties") is False, f"{where} is open to undocumented fields"


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        return [schema["$ref"]] if "$ref" in schema else [r for v in schema.values() for r in _refs(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in _refs(v)]
    return []


def test_every_answer_conforms_to_its_documented_schema(
    client, sessions, settings, conforms, public_hook_host
) -> None:
    """One of each JSON answer, read back as a client would, against the document's schema."""
    video = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "video", "metadata": {"k": "v"}})
    assert video.status_code == 202
    conforms("Job", video.get_json())
    image = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "image", "params": {"seed": 1}})
    assert image.status_code == 202, image.get_json()
    conforms("Job", image.get_json())
    hooked = {"prompt": "p", "modality": "text", "webhook": {"url": f"https://{HOOK_HOST}/h"}}
    text = client.post("/v1/jobs", json=hooked)
    assert text.status_code == 202, text.get_json()
    job_id = text.get_json()["id"]
    conforms("Job", client.get(f"/v1/jobs/{job_id}").get_json())
    conforms("JobList", client.get("/v1/jobs?limit=1").get_json())  # a next_cursor too
    canceled = client.post(f"/v1/jobs/{job_id}/cancel")
    assert canceled.status_code == 200
    conforms("Job", canceled.get_json())
    events = client.get(f"/v1/jobs/{job_id}/events")
    assert events.status_code == 200 and events.get_json()["data"]
    conforms("JobEventList", events.get_json())
    for group_by in ("", "?group_by=day", "?group_by=model", "?group_by=modality"):
        usage = client.get(f"/v1/usage{group_by}")
        assert usage.status_code == 200
        conforms("Usage", usage.get_json())
    models = client.get("/v1/models")
    assert models.status_code == 200 and models.get_json()["data"]
    conforms("ModelList", models.get_json())
    named = client.post("/v1/jobs", json={"prompt": "p", "modality": "text", "model": "echo"})
    assert named.status_code == 202, named.get_json()
    assert named.get_json()["models"]["text"]["asked"] == "echo"
    conforms("Job", named.get_json())

    endpoint = client.post("/v1/webhooks", json={"url": f"https://{HOOK_HOST}/e", "description": "d"})
    assert endpoint.status_code == 201, endpoint.get_json()
    conforms("WebhookEndpoint", endpoint.get_json())
    conforms("WebhookEndpointList", client.get("/v1/webhooks").get_json())
    conforms("WebhookSecret", client.get("/v1/webhooks/secret").get_json())
    rotated = client.post("/v1/webhooks/secret/rotate").get_json()
    assert "previous_expires_at" in rotated
    conforms("WebhookSecret", rotated)
    # The relay's first step, here rather than in a worker: the canceled job's deliveries, one tried.
    assert fan_out(sessions, settings, uuid.UUID(job_id)) > 0
    with transaction(sessions) as s:
        tried = s.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == uuid.UUID(job_id))).first()
        assert tried is not None
        tried.attempts, tried.last_status_code, tried.last_error = 1, 500, "HTTP 500"
        tried.log.append(WebhookAttempt(number=1, duration_ms=12, status_code=500, response_excerpt="no"))
    deliveries = client.get(f"/v1/jobs/{job_id}/webhook-deliveries").get_json()
    assert deliveries["data"] and any(d["attempt_log"] for d in deliveries["data"])
    conforms("WebhookDeliveryList", deliveries)
    for d in deliveries["data"]:
        redelivered = client.post(f"/v1/webhook-deliveries/{d['id']}/redeliver")
        assert redelivered.status_code == 202
        conforms("WebhookDelivery", redelivered.get_json())

    conforms("Health", client.get("/v1/health").get_json())
    ready = client.get("/v1/ready")
    assert ready.status_code == 200, ready.get_json()
    conforms("Ready", ready.get_json())
    problem = client.get(f"/v1/jobs/{uuid.uuid4()}")
    assert problem.status_code == 404
    conforms("Problem", problem.get_json())
    invalid = client.post("/v1/jobs", json={"prompt": "p", "modality": "video", "params": {"width": 65}})
    assert invalid.status_code == 422 and invalid.get_json()["errors"]
    conforms("Problem", invalid.get_json())


def test_an_undocumented_field_fails_the_check(client, conforms) -> None:
    """The check above has teeth: one extra key in a real answer is refused."""
    body = client.post("/v1/jobs", json={"prompt": "p", "modality": "text"}).get_json()
    body["outputs"]["audio_url"] = None
    with pytest.raises(AssertionError, match="audio_url"):
        conforms("Job", body)
