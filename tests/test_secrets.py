"""Secrets (API keys, webhook secrets, database passwords) never appear in logs or error bodies."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from app import create_app
from models import redaction
from models.redaction import redact
from tasks.celery_app import create_celery
from tests.support.api import authed_client_class, make_api_key, wait_finished
from tests.support.workers import in_process_worker

DB_PASSWORD = "S3cret-db-pw-7f2c"
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrfNvbnOCsYvVKr6kfWUwM"


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("key gq_abcd1234_Zx9-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa rejected", "Zx9-aaaa"),
        ("Authorization: Bearer some.opaque-token", "some.opaque-token"),
        (f"signing with {WEBHOOK_SECRET}", "MfKQ9r8GKY"),
        (f"postgresql+psycopg://app:{DB_PASSWORD}@db:5432/genqueue", DB_PASSWORD),
        ("redis://:hunter2hunter2@cache:6379/0", "hunter2hunter2"),
        ("amqp://guest:guestpw@rabbit//", "guestpw"),
        ("password=letmein123 host=db", "letmein123"),
    ],
)
def test_redact_masks_every_kind_of_secret(line: str, secret: str) -> None:
    masked = redact(line)
    assert secret not in masked and "***" in masked


def test_redact_keeps_what_operators_need() -> None:
    assert redact("key gq_abcd1234_" + "x" * 43) == "key gq_abcd1234_***"
    assert redact("postgresql://app:pw@db:5432/genqueue") == "postgresql://app:***@db:5432/genqueue"
    plain = "job 5c7e... failed: text stage exceeded its time limit"
    assert redact(plain) == plain


SECRET_PIECES = st.one_of(
    st.text(max_size=12),
    st.sampled_from([
        "gq_abcd1234_", "Zx9-aaaaaaaa", "Bearer ", "BEARER\t", "whsec_", "://", "user:", "pw@", "PassWord",
        "passwd", "PWD", "Secret", "api_key", "API-KEY", "apikey", "=", ": ", "@host", " ", "/",
    ]),
)  # fmt: skip


@given(text=st.lists(SECRET_PIECES, max_size=12).map("".join))
@settings(max_examples=500, deadline=None, database=None)
def test_redact_skips_only_text_no_pattern_can_match(text: str) -> None:
    # redact returns a string holding none of the patterns' needed words at once: the same as
    # running every substitution on it.
    full = text
    for pattern, replacement in redaction._PATTERNS:
        full = pattern.sub(replacement, full)
    assert redact(text) == full


def test_a_full_job_run_logs_no_secret(settings, sessions, broker, caplog):
    """API, worker and failures, all logged at DEBUG: no key, password or webhook secret shows."""
    url = make_url(settings.database_url).set(password=DB_PASSWORD)  # trust auth: accepted, unused
    secret_settings = settings.model_copy(
        update={"database_url": url.render_as_string(hide_password=False)}
    )
    key = make_api_key(sessions)
    flask_app = create_app(secret_settings)
    flask_app.test_client_class = authed_client_class(key)

    def leak() -> None:  # an unexpected error whose message carries every kind of secret
        raise RuntimeError(f"failed with {key} on {secret_settings.database_url} signing {WEBHOOK_SECRET}")

    flask_app.add_url_rule("/v1/leak", view_func=leak)
    client = flask_app.test_client()
    caplog.set_level(logging.DEBUG)
    bodies = []
    worker_app = create_celery(secret_settings, set_as_current=False)
    with in_process_worker(worker_app, concurrency=2, loglevel="DEBUG"):
        logging.getLogger("genqueue.test").info("settings: %r", secret_settings)
        video = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "video",
                                              "params": {"width": 64, "height": 64, "num_frames": 5}})
        failing = client.post("/v1/jobs", json={"prompt": "[[fail]] now", "modality": "text"})
        transient = client.post("/v1/jobs", json={"prompt": "[[transient]] once", "modality": "text"})
        for resp in (video, failing, transient):
            assert resp.status_code == 202, resp.get_data(as_text=True)
            bodies.append(resp.get_data(as_text=True))
        assert wait_finished(client, video.get_json()["id"])["status"] == "succeeded"
        assert wait_finished(client, failing.get_json()["id"])["status"] == "failed"
        wait_finished(client, transient.get_json()["id"])
        for resp in (
            client.get("/v1/leak"),
            flask_app.test_client().get("/v1/jobs", headers={"Authorization": f"Bearer {key}x"}),
            flask_app.test_client().get("/v1/jobs", headers={"Authorization": "Bearer " + key[::-1]}),
        ):
            assert resp.status_code in (401, 500)
            bodies.append(resp.get_data(as_text=True))
    flask_app.extensions["genqueue"].engine.dispose()

    logged = caplog.text + "".join(r.getMessage() for r in caplog.records)
    assert "genqueue.test" in caplog.text and "RuntimeError" in caplog.text  # the logs were captured
    assert any(r.name.startswith("celery") for r in caplog.records)  # the worker's too
    for secret in (key, key.split("_", 2)[2], DB_PASSWORD, WEBHOOK_SECRET, key[::-1]):
        assert secret not in logged
        assert all(secret not in body for body in bodies)
    assert key[:11] in caplog.text  # the key's prefix stays, to tell which key it was


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_log_lines_mask_secrets_in_messages_extras_and_tracebacks(fmt: str) -> None:
    """Both formats of models.logs: the message, an `extra=` field, a nested value, an object's
    repr and an exception's traceback are all masked, whatever the record factory did."""
    import io
    import json

    from models import logs

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonLines() if fmt == "json" else logs.TextLines())
    log = logging.getLogger(f"genqueue.test.secrets.{fmt}")
    log.addHandler(handler)
    log.propagate = False
    url = f"postgresql+psycopg://app:{DB_PASSWORD}@db/genqueue"

    class Config:
        def __repr__(self) -> str:
            return f"Config(signing={WEBHOOK_SECRET})"

    try:
        log.warning(
            "connecting to %s",
            url,
            extra={"broker": "redis://:hunter2hunter2@cache:6379/0", "nested": {"key": [WEBHOOK_SECRET]},
                   "config": Config()},
        )  # fmt: skip
        try:
            raise RuntimeError(f"failed on {url} with Authorization: Bearer tok-{DB_PASSWORD}")
        except RuntimeError:
            log.exception("unexpected")
    finally:
        log.removeHandler(handler)
    out = stream.getvalue()
    for secret in (DB_PASSWORD, "hunter2hunter2", "MfKQ9r8GKY"):
        assert secret not in out
    assert "RuntimeError" in out and "app:***@db" in out
    if fmt == "json":
        first, second = (json.loads(line) for line in out.splitlines())
        assert first["broker"] == "redis://:***@cache:6379/0" and first["nested"] == {"key": ["whsec_***"]}
        assert "whsec_***" in first["config"] and "Traceback" in second["exc_info"]
