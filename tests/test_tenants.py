"""Tenants and API keys on real Postgres: hashed keys, 401s, tenant isolation, the CLI, the migration."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from alembic import command
from click.testing import CliRunner
from sqlalchemy import create_engine, select, text

from app.cli import main
from models import ApiKey, Job, JobStatus, Tenant
from models.db import make_session_factory, transaction
from models.keys import authenticate, create_key, hash_key
from models.migrate import alembic_config, upgrade
from models.tenant import DEFAULT_TENANT_ID
from tests.support.api import assert_problem, authed_client_class, make_api_key, submit

# --- keys ---------------------------------------------------------------------------------------


def test_key_is_stored_hashed_with_a_visible_prefix(sessions):
    with transaction(sessions) as s:
        row, key = create_key(s, "acme", "ci")
    assert key.startswith(f"gq_{row.prefix}_") and len(key) == 3 + 8 + 1 + 43
    with sessions() as s:
        stored = s.scalars(select(ApiKey)).one()
        dump = " ".join(str(v) for v in s.execute(text("SELECT * FROM api_keys")).one())
        assert stored.key_hash == hash_key(key) and key not in dump
        assert key.split("_", 2)[2] not in dump  # not the secret part either
        principal = authenticate(s, key)
        assert principal is not None and principal.tenant_name == "acme"
        assert authenticate(s, key[:-1] + ("A" if key[-1] != "A" else "B")) is None
        assert authenticate(s, "gq_" + row.prefix) is None


def test_two_keys_never_share_a_prefix(sessions):
    with transaction(sessions) as s:
        prefixes = {create_key(s, "acme")[0].prefix for _ in range(30)}
    assert len(prefixes) == 30


# --- authentication ------------------------------------------------------------------------------

JOB_ROUTES = [
    ("post", "/v1/jobs"),
    ("get", "/v1/jobs"),
    ("get", f"/v1/jobs/{uuid.uuid4()}"),
    ("post", f"/v1/jobs/{uuid.uuid4()}/cancel"),
    ("get", f"/v1/jobs/{uuid.uuid4()}/content"),
]


@pytest.mark.parametrize(("method", "path"), JOB_ROUTES)
@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Token gq_abc", "Bearer not-a-key",
     "Bearer gq_aaaaaaaa_" + "x" * 43],
)  # fmt: skip
def test_missing_or_invalid_key_is_401(anon_client, sessions, method, path, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    resp = getattr(anon_client, method)(path, headers=headers, json={"prompt": "p", "modality": "text"})
    body = assert_problem(resp, 401)
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert "Bearer" in body["detail"] or "invalid" in body["detail"]
    token = (authorization or "").partition(" ")[2].strip()
    if len(token) > 6:  # what was sent is never echoed back
        assert token not in resp.get_data(as_text=True)
    with sessions() as s:
        assert s.scalar(select(Job.id)) is None


def test_revoked_key_is_401_within_the_key_cache_ttl(settings, sessions, broker, api_key, cli):
    from cachetools import TTLCache

    from app import create_app
    from app.auth import EXTENSION

    app = create_app(settings.model_copy(update={"auth_cache_s": 30}))
    clock = [0.0]  # the key cache's clock, moved by hand: no wall-clock window to miss
    app.extensions[EXTENSION]._cache = TTLCache(10_000, 30, timer=lambda: clock[0])
    app.test_client_class = authed_client_class(api_key)
    client = app.test_client()
    assert submit(client).status_code == 202  # the key is now cached by this process
    assert cli("keys", "revoke", api_key.split("_")[1]).exit_code == 0
    clock[0] = 29.5
    assert client.get("/v1/jobs").status_code == 200  # still trusted until the entry expires
    clock[0] = 30.5
    assert_problem(client.get("/v1/jobs"), 401)
    assert_problem(submit(client), 401)


def test_revoked_key_is_401_at_once_without_the_key_cache(settings, sessions, broker, api_key, cli):
    from app import create_app

    app = create_app(settings.model_copy(update={"auth_cache_s": 0}))
    app.test_client_class = authed_client_class(api_key)
    client = app.test_client()
    assert submit(client).status_code == 202
    assert cli("keys", "revoke", api_key.split("_")[1]).exit_code == 0
    assert_problem(client.get("/v1/jobs"), 401)


def test_health_ready_and_documents_need_no_key(anon_client):
    for path in ("/v1/health", "/v1/ready", "/openapi.json", "/docs", "/metrics"):
        assert anon_client.get(path).status_code == 200, path
    # Unknown routes and methods answer as such, never revealing whether a key would help.
    assert_problem(anon_client.get("/v1/nothing"), 404)
    assert_problem(anon_client.delete("/v1/jobs"), 405)


def test_the_key_is_bearer_case_insensitive(anon_client, api_key):
    assert anon_client.get("/v1/jobs", headers={"Authorization": f"bearer  {api_key}"}).status_code == 200


# --- isolation -----------------------------------------------------------------------------------


def test_tenants_see_only_their_own_jobs(client, tenant_client, sessions, settings):
    other = tenant_client("other")
    mine = submit(client).get_json()
    theirs = submit(other, prompt="their secret prompt").get_json()
    done = Job(
        tenant_id=_tenant_id(sessions, "other"), modality="video", prompt="p", status=JobStatus.SUCCEEDED,
        output_text="their text", artifact_path=f"{uuid.uuid4()}/video.mp4",
    )  # fmt: skip
    with transaction(sessions) as s:
        s.add(done)
    assert [j["id"] for j in client.get("/v1/jobs").get_json()["data"]] == [mine["id"]]
    assert {j["id"] for j in other.get("/v1/jobs").get_json()["data"]} == {theirs["id"], str(done.id)}
    for job_id in (theirs["id"], str(done.id)):
        for resp in (
            client.get(f"/v1/jobs/{job_id}"),
            client.get(f"/v1/jobs/{job_id}/content?variant=text"),
            client.get(f"/v1/jobs/{job_id}/content"),
            client.post(f"/v1/jobs/{job_id}/cancel"),
        ):
            body = assert_problem(resp, 404)  # not 403: another tenant's job does not exist for this one
            assert "secret" not in resp.get_data(as_text=True) and body["detail"].startswith("No job")
    with sessions() as s:  # the cancel attempt changed nothing
        assert s.get(Job, uuid.UUID(theirs["id"])).status == JobStatus.QUEUED
    assert other.get(f"/v1/jobs/{theirs['id']}").get_json()["prompt"] == "their secret prompt"
    assert other.post(f"/v1/jobs/{theirs['id']}/cancel").get_json()["status"] == "canceled"


def test_submitted_jobs_belong_to_the_key_tenant(tenant_client, sessions):
    job = submit(tenant_client("acme")).get_json()
    with sessions() as s:
        assert s.get(Job, uuid.UUID(job["id"])).tenant_id == _tenant_id(sessions, "acme")


def _tenant_id(sessions, name: str) -> uuid.UUID:
    with sessions() as s:
        return s.scalars(select(Tenant.id).where(Tenant.name == name)).one()


# --- CLI -----------------------------------------------------------------------------------------


@pytest.fixture
def cli(settings, sessions, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    runner = CliRunner()
    return lambda *args: runner.invoke(main, list(args), catch_exceptions=False)


def test_cli_create_list_revoke(cli, anon_client):
    created = cli("keys", "create", "--tenant", "acme", "--label", "ci")
    assert created.exit_code == 0
    key = created.stdout.strip()
    prefix = key.split("_")[1]
    assert "not shown again" in created.stderr
    headers = {"Authorization": f"Bearer {key}"}
    assert anon_client.get("/v1/jobs", headers=headers).status_code == 200
    listed = cli("keys", "list").stdout
    assert prefix in listed and "acme" in listed and "ci" in listed and key not in listed
    assert cli("keys", "revoke", prefix).exit_code == 0
    assert assert_problem(anon_client.get("/v1/jobs", headers=headers), 401)
    assert cli("keys", "revoke", prefix).exit_code == 1  # already revoked
    assert "acme" in cli("keys", "list", "--tenant", "acme").stdout
    assert cli("keys", "list", "--tenant", "nobody").stdout.count("\n") == 1  # the header only


def test_cli_rejects_a_bad_tenant_name(cli):
    result = cli("keys", "create", "--tenant", "bad name!")
    assert result.exit_code == 2 and "tenant" in result.output


def test_cli_sets_a_plan(cli, sessions):
    shown = cli("tenants", "plan", "acme", "--max-width", "512", "--max-priority", "normal")
    assert shown.exit_code == 0, shown.output
    assert '"max_width": 512' in shown.stdout and '"max_frames": 121' in shown.stdout
    with sessions() as s:
        assert s.scalars(select(Tenant.plan).where(Tenant.name == "acme")).one() == {
            "max_width": 512, "max_priority": "normal",
        }  # fmt: skip
    cli("tenants", "plan", "acme", "--unset", "max_width", "--rate-limit", "5/second")
    with sessions() as s:
        assert s.scalars(select(Tenant.plan).where(Tenant.name == "acme")).one() == {
            "max_priority": "normal", "rate_limit": "5/second",
        }  # fmt: skip
    bad = cli("tenants", "plan", "acme", "--rate-limit", "lots")
    assert bad.exit_code == 2 and "rate_limit" in bad.output
    assert "acme" in cli("tenants", "list").stdout
    assert cli("tenants", "plan", "nobody").exit_code == 1


def test_the_cli_sets_a_plans_lifetimes_within_bounds(cli, sessions) -> None:
    shown = cli("tenants", "plan", "acme-cli", "--retention-s", "3600", "--media-url-ttl-s", "600")
    assert shown.exit_code == 0, shown.output
    assert '"retention_s": 3600' in shown.stdout and '"media_url_ttl_s": 600' in shown.stdout
    bad = cli("tenants", "plan", "acme-cli", "--media-url-ttl-s", "30")
    assert bad.exit_code == 2 and "media_url_ttl_s must be 60 to 604800" in bad.output


# --- migration -----------------------------------------------------------------------------------


def test_migration_gives_existing_jobs_the_default_tenant(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'gq.db'}"
    upgrade(url, "0001")
    engine = create_engine(url)
    job_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, status, modality, prompt, params, priority, progress, metadata,"
                " attempts, created_at, updated_at) VALUES (:id, 'queued', 'text', 'old', '{}', 'normal',"
                " 0, '{}', 0, '2026-01-01', '2026-01-01')"
            ),
            {"id": job_id.hex},
        )
    command.upgrade(alembic_config(url), "head")
    with make_session_factory(engine)() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.prompt == "old" and job.tenant_id == DEFAULT_TENANT_ID
        assert s.get(Tenant, DEFAULT_TENANT_ID).name == "default"
    engine.dispose()


def test_second_tenant_key_helper(sessions):
    key = make_api_key(sessions, "acme", max_width=256)
    with sessions() as s:
        principal = authenticate(s, key)
    assert principal is not None and principal.plan_overrides == {"max_width": 256}


def test_an_effective_plan_follows_its_settings_and_overrides(settings):
    from models.plans import Plan

    first = Plan.effective(settings, {"max_width": 256, "unknown": 1})
    assert first is Plan.effective(settings, {"unknown": 2, "max_width": 256})  # remembered
    assert first.max_width == 256 and first.max_height == settings.plan_max_height
    other = settings.model_copy(update={"plan_max_height": 128})
    assert Plan.effective(other, {"max_width": 256}).max_height == 128  # a new settings object
    assert Plan.effective(settings, {"max_width": 512}).max_width == 512
    listed = Plan.effective(settings, {"allowed_models": ["echo"]})  # not hashable: built each time
    assert listed.allowed_models == ["echo"] and listed.max_width == settings.plan_max_width
