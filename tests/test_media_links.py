"""Signed, expiring links to job outputs (/v1/media) and CORS: signatures, expiry, rotation, revocation,
HEAD, Range, caching headers, preflights."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from flask.testing import FlaskClient
from pydantic import SecretStr

from models import Job, JobStatus
from models.db import transaction
from models.media_links import MediaSigner
from tests.support.api import assert_problem, wait_finished

PAGE = "https://player.example"
KEY, NEW_KEY = "media-key-one", "media-key-two"


def signer(*keys: str, ttl_s: int = 3600) -> MediaSigner:
    return MediaSigner(keys, ttl_s)


# --- the signature ------------------------------------------------------------------------------


def test_a_link_verifies_and_any_change_breaks_it() -> None:
    s, jid = signer(KEY), str(uuid.uuid4())
    exp = s.expires()
    sig = parse_qs(s.query(jid, "video", exp))["sig"][0]
    assert s.verify(jid, "video", str(exp), sig) == "ok"
    assert s.verify(jid, "thumbnail", str(exp), sig) == "invalid"  # another variant
    assert s.verify(str(uuid.uuid4()), "video", str(exp), sig) == "invalid"  # another job
    assert s.verify(jid, "video", str(exp + 3600), sig) == "invalid"  # a longer life
    # Every other last character, including the spellings base64 decodes to the same bytes.
    for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_":
        if c != sig[-1]:
            assert s.verify(jid, "video", str(exp), sig[:-1] + c) == "invalid", c
    for bad_exp, bad_sig in (("", sig), ("-1", sig), ("1e9", sig), (str(exp), ""), (str(exp), "é")):
        assert s.verify(jid, "video", bad_exp, bad_sig) == "invalid"
    assert signer("another key").verify(jid, "video", str(exp), sig) == "invalid"


def test_a_link_expires() -> None:
    s, jid = signer(KEY, ttl_s=600), str(uuid.uuid4())
    now = time.time()
    exp = s.expires(now)
    assert now + 600 - 60 <= exp <= now + 600  # a tenth of the life at most is lost to sharing
    sig = parse_qs(s.query(jid, "video", exp))["sig"][0]
    assert s.verify(jid, "video", str(exp), sig, now=exp - 1) == "ok"
    assert s.verify(jid, "video", str(exp), sig, now=exp) == "expired"
    assert s.remaining_s(str(exp), now=exp - 30) == 30


def test_links_issued_together_are_one_url() -> None:
    s, jid = signer(KEY), uuid.uuid4()
    t0 = 1_800_000_000.0  # a multiple of the step (300 s for a 1 h life)
    assert s.url("https://x", jid, "video", now=t0) == s.url("https://x", jid, "video", now=t0 + 299)
    assert s.url("https://x", jid, "video", now=t0) != s.url("https://x", jid, "video", now=t0 + 300)


def test_rotation_signs_with_the_first_key_and_verifies_with_any() -> None:
    jid = str(uuid.uuid4())
    old = signer(KEY)
    exp = old.expires()
    old_sig = parse_qs(old.query(jid, "video", exp))["sig"][0]
    rotated = signer(NEW_KEY, KEY)
    new_sig = parse_qs(rotated.query(jid, "video", exp))["sig"][0]
    assert new_sig != old_sig and signer(NEW_KEY).verify(jid, "video", str(exp), new_sig) == "ok"
    assert rotated.verify(jid, "video", str(exp), old_sig) == "ok"  # old links live on
    assert signer(NEW_KEY).verify(jid, "video", str(exp), old_sig) == "invalid"  # until it is dropped


# --- the API ------------------------------------------------------------------------------------


def _video_row(sessions: Any, root: Path) -> tuple[Job, bytes]:
    job_id = uuid.uuid4()
    data = bytes(range(256)) * 40
    folder = root / str(job_id)
    folder.mkdir(parents=True)
    (folder / "video.mp4").write_bytes(data)
    (folder / "thumbnail.jpg").write_bytes(b"\xff\xd8\xff\xe0fake-jpeg")
    with transaction(sessions) as s:
        job = Job(
            id=job_id, modality="video", status=JobStatus.SUCCEEDED, prompt="p", params={}, priority="normal",
            progress=100, attempts=1, recoveries=0, cached=False, output_text="a shot",
            artifact_path=f"{job_id}/video.mp4", artifact_bytes=len(data),
        )  # fmt: skip
        s.add(job)
    return job, data


@pytest.fixture
def signed_app(make_app):
    app = make_app(media_url_keys=SecretStr(KEY), cors_origins=[PAGE])
    app.testing = True
    return app


@pytest.fixture
def anon(signed_app) -> FlaskClient:
    return FlaskClient(signed_app, signed_app.response_class)


def _links(signed_app, job_id: Any) -> dict[str, Any]:
    outputs: dict[str, Any] = signed_app.test_client().get(f"/v1/jobs/{job_id}").get_json()["outputs"]
    return outputs


def _local(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def test_a_job_carries_absolute_signed_links(signed_app, sessions, settings) -> None:
    job, _ = _video_row(sessions, Path(settings.artifact_dir))
    out = _links(signed_app, job.id)
    for variant in ("video", "thumbnail", "text"):
        url = out[f"{variant}_signed_url"]
        assert url.startswith(f"http://localhost/v1/media/{job.id}/{variant}?expires="), url
    expires = int(parse_qs(urlsplit(out["video_signed_url"]).query)["expires"][0])
    assert abs(expires - time.time() - 3600) < 301
    assert out["signed_urls_expire_at"].endswith("Z")
    # The configured public origin wins over the request's host (a proxy in front).
    behind = signed_app.extensions["genqueue"].settings
    behind.public_base_url = "https://media.example.com/"
    try:
        assert _links(signed_app, job.id)["video_signed_url"].startswith(
            "https://media.example.com/v1/media/"
        )
    finally:
        behind.public_base_url = ""


def test_a_signed_link_needs_no_key_and_serves_ranges_and_head(signed_app, anon, sessions, settings) -> None:
    job, data = _video_row(sessions, Path(settings.artifact_dir))
    url = _local(_links(signed_app, job.id)["video_signed_url"])
    whole = anon.get(url)
    assert whole.status_code == 200 and whole.data == data and whole.mimetype == "video/mp4"
    assert whole.headers["Accept-Ranges"] == "bytes" and whole.headers["ETag"]
    cache = whole.cache_control
    assert cache.public and 3600 - 301 <= (cache.max_age or 0) <= 3600 and not cache.no_cache
    head = anon.head(url)
    assert head.status_code == 200 and head.data == b"" and head.headers["Content-Length"] == str(len(data))
    part = anon.get(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.data == data[100:200]
    assert part.headers["Content-Range"] == f"bytes 100-199/{len(data)}"
    beyond = anon.get(url, headers={"Range": f"bytes={len(data) + 10}-"})
    assert beyond.status_code == 416 and beyond.headers["Content-Range"] == f"bytes */{len(data)}"
    again = anon.get(url, headers={"If-None-Match": whole.headers["ETag"]})
    assert again.status_code == 304 and again.data == b""
    thumb = anon.get(_local(_links(signed_app, job.id)["thumbnail_signed_url"]))
    assert thumb.status_code == 200 and thumb.mimetype == "image/jpeg"
    text = anon.get(_local(_links(signed_app, job.id)["text_signed_url"]))
    assert text.status_code == 200 and text.data == b"a shot" and text.cache_control.public


def test_tampered_and_expired_links_get_403_never_bytes(signed_app, anon, sessions, settings) -> None:
    job, data = _video_row(sessions, Path(settings.artifact_dir))
    url = _local(_links(signed_app, job.id)["video_signed_url"])
    path, query = url.split("?")
    q = {k: v[0] for k, v in parse_qs(query).items()}
    tampered = [
        f"{path}?expires={q['expires']}&sig={q['sig'][:-2]}xx",
        f"{path}?expires={int(q['expires']) + 86400}&sig={q['sig']}",
        f"{path.replace('/video', '/thumbnail')}?{query}",
        f"/v1/media/{uuid.uuid4()}/video?{query}",
        path,
    ]
    for bad in tampered:
        resp = anon.get(bad)
        body = assert_problem(resp, 403)
        assert body["type"].endswith(":invalid-link") and data not in resp.data, bad
    past = int(time.time()) - 10
    expired = f"{path}?{signer(KEY).query(job.id, 'video', past)}"
    assert assert_problem(anon.get(expired), 403)["type"].endswith(":expired-link")
    head = anon.head(expired)
    assert head.status_code == 403 and head.mimetype == "application/problem+json" and head.data == b""


def test_a_rotated_key_keeps_old_links_until_dropped(make_app, signed_app, sessions, settings) -> None:
    job, data = _video_row(sessions, Path(settings.artifact_dir))
    url = _local(_links(signed_app, job.id)["video_signed_url"])
    rotated = make_app(media_url_keys=SecretStr(f"{NEW_KEY}, {KEY}"))
    assert FlaskClient(rotated).get(url).data == data
    fresh = _local(_links(rotated, job.id)["video_signed_url"])
    assert fresh != url
    dropped = make_app(media_url_keys=SecretStr(NEW_KEY))
    assert assert_problem(FlaskClient(dropped).get(url), 403)
    assert FlaskClient(dropped).get(fresh).data == data


def test_a_deleted_job_or_file_revokes_its_links(signed_app, anon, sessions, settings) -> None:
    job, _ = _video_row(sessions, Path(settings.artifact_dir))
    links = _links(signed_app, job.id)
    (Path(settings.artifact_dir) / str(job.id) / "thumbnail.jpg").unlink()
    assert_problem(anon.get(_local(links["thumbnail_signed_url"])), 404)
    with transaction(sessions) as s:
        s.delete(s.get(Job, job.id))
    assert_problem(anon.get(_local(links["video_signed_url"])), 404)
    assert_problem(anon.get(_local(links["text_signed_url"])), 404)


def test_without_keys_there_are_no_signed_links(client, anon_client, sessions, settings) -> None:
    job, _ = _video_row(sessions, Path(settings.artifact_dir))
    out = client.get(f"/v1/jobs/{job.id}").get_json()["outputs"]
    assert out["video_signed_url"] is None and out["signed_urls_expire_at"] is None
    query = signer(KEY).query(job.id, "video", int(time.time()) + 60)
    assert_problem(anon_client.get(f"/v1/media/{job.id}/video?{query}"), 404)


def test_a_real_jobs_video_through_its_signed_link(signed_app, anon, worker) -> None:
    client = signed_app.test_client()
    params = {"width": 64, "height": 64, "num_frames": 9, "steps": 2}
    job = client.post(
        "/v1/jobs", json={"prompt": "a red fox", "modality": "video", "params": params}
    ).get_json()
    done = wait_finished(client, job["id"], timeout=60)
    assert done["status"] == "succeeded", done
    video = anon.get(_local(done["outputs"]["video_signed_url"]))
    keyed = client.get(f"/v1/jobs/{job['id']}/content?variant=video")
    assert video.status_code == 200 and video.data == keyed.data and video.data[4:8] == b"ftyp"


# --- CORS ---------------------------------------------------------------------------------------


def test_a_preflight_from_an_allowed_origin_is_answered_without_a_key(anon) -> None:
    resp = anon.options(
        "/v1/jobs",
        headers={
            "Origin": PAGE,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "Authorization, Content-Type, Idempotency-Key",
        },
    )
    assert resp.status_code == 200, resp.data
    assert resp.headers["Access-Control-Allow-Origin"] == PAGE
    assert "POST" in resp.headers["Access-Control-Allow-Methods"]
    allowed = resp.headers["Access-Control-Allow-Headers"].lower()
    assert {"authorization", "content-type", "idempotency-key"} <= {h.strip() for h in allowed.split(",")}
    other = anon.options(
        "/v1/jobs", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert "Access-Control-Allow-Origin" not in other.headers


def test_answers_to_an_allowed_origin_expose_the_headers_clients_read(
    signed_app, anon, sessions, settings
) -> None:
    job, _ = _video_row(sessions, Path(settings.artifact_dir))
    url = _local(_links(signed_app, job.id)["video_signed_url"])
    resp = anon.get(url, headers={"Origin": PAGE, "Range": "bytes=0-9"})
    assert resp.status_code == 206 and resp.headers["Access-Control-Allow-Origin"] == PAGE
    exposed = {h.strip().lower() for h in resp.headers["Access-Control-Expose-Headers"].split(",")}
    want = {"etag", "content-range", "accept-ranges", "retry-after", "x-request-id", "location"}
    assert want <= exposed
    assert "Origin" in resp.headers.get("Vary", "")
    denied = anon.get(url, headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in denied.headers
    # Errors carry CORS too, so a page can read why (a 401 here).
    unauth = anon.get("/v1/jobs", headers={"Origin": PAGE})
    assert unauth.status_code == 401 and unauth.headers["Access-Control-Allow-Origin"] == PAGE


def test_no_cors_unless_configured(anon_client) -> None:
    resp = anon_client.get("/v1/health", headers={"Origin": PAGE})
    assert "Access-Control-Allow-Origin" not in resp.headers


def test_embedded_mode_keeps_one_random_signing_key(tmp_path: Path, monkeypatch) -> None:
    from tasks.embedded import DEV_MEDIA_KEY_FILE, embedded_settings

    monkeypatch.delenv("GENQUEUE_MEDIA_URL_KEYS", raising=False)
    first = embedded_settings(tmp_path).media_url_keys
    assert first is not None and len(first.get_secret_value()) >= 32
    assert embedded_settings(tmp_path).media_url_keys == first  # the same after a restart
    assert (tmp_path / DEV_MEDIA_KEY_FILE).stat().st_mode & 0o077 == 0
    monkeypatch.setenv("GENQUEUE_MEDIA_URL_KEYS", "configured")
    configured = embedded_settings(tmp_path).media_url_keys
    assert configured is not None and configured.get_secret_value() == "configured"


def test_the_signing_keys_never_show_in_settings_output(settings) -> None:
    configured = settings.model_copy(update={"media_url_keys": SecretStr(f"{KEY},{NEW_KEY}")})
    assert KEY not in repr(configured) and KEY not in str(configured.model_dump())
