"""Talking to the API in tests: keys and authenticated clients, submitting, problem bodies, waiting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask.testing import FlaskClient
from sqlalchemy.orm import Session, sessionmaker

from models.db import transaction
from models.keys import create_key, set_plan
from models.tenant import DEFAULT_TENANT_NAME
from tests.support.jobs import FINISHED
from tests.support.procs import wait_for


def make_api_key(sessions: sessionmaker[Session], tenant: str = DEFAULT_TENANT_NAME, **plan: Any) -> str:
    """A fresh API key for `tenant` (created if new), with plan overrides if given."""
    with transaction(sessions) as s:
        if plan:
            set_plan(s, tenant, plan)
        return create_key(s, tenant)[1]


def authed_client_class(key: str) -> type[FlaskClient]:
    """A test client class that sends `Authorization: Bearer <key>` on every request."""

    class AuthedClient(FlaskClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {key}"

    return AuthedClient


def submit(client: FlaskClient, **body: Any) -> Any:
    """POST /v1/jobs: a text job "a fox" unless `body` says otherwise; the response, unchecked."""
    return client.post("/v1/jobs", json={"prompt": "a fox", "modality": "text", **body})


def assert_problem(resp: Any, status: int) -> dict[str, Any]:
    """The RFC 9457 body of `resp`, after checking its status, media type and members."""
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert resp.mimetype == "application/problem+json"
    body: dict[str, Any] = resp.get_json()
    assert body["status"] == status and {"type", "title", "detail", "errors"} <= body.keys()
    assert body["type"] and body["title"]
    return body


def wait_finished(
    client: FlaskClient,
    job: str,
    timeout: float = 30,
    interval: float = 0.05,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """GET the job (an id or its Location) until it has finished; its last representation."""
    url = job if job.startswith("/") else f"/v1/jobs/{job}"
    last: dict[str, Any] = {}

    def finished() -> dict[str, Any] | None:
        last.clear()
        last.update(client.get(url, headers=dict(headers or {})).get_json())
        return dict(last) if last.get("status") in FINISHED else None

    try:
        return wait_for(finished, timeout, interval, f"job {url} to finish")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it is {last.get('status')}/{last.get('stage')}") from None
