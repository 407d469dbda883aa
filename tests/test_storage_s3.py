"""The S3 backend against a real S3 API (moto's server on 127.0.0.1): workers upload, the API
downloads (whole, a Range, a signed link, a presigned URL), DELETE and retention remove, and a
worker killed mid-upload leaves no partial or duplicate object."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from flask.testing import FlaskClient
from pydantic import SecretStr
from sqlalchemy import update

from models import Job
from models.base import utcnow
from models.db import transaction
from models.storage import LocalStorage, open_storage
from models.storage.s3 import S3Storage
from tasks import retention as retention_task
from tasks.runtime import Runtime
from tests.support.api import wait_finished
from tests.support.jobs import event_rows, files, get, wait_done
from tests.support.procs import MotoServer, Worker, wait_for, worker_env
from tests.support.workers import thread_workers

GEN = "tests.support.generators"
VIDEO = {"width": 128, "height": 128, "num_frames": 17, "steps": 2}  # noise: ~190 KB, 3 parts
PART = 64 << 10


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log", part_min_size=PART).start()
    server.client().create_bucket(Bucket="genqueue-test")
    yield server
    server.stop()


@pytest.fixture
def s3_overrides(moto: MotoServer) -> dict[str, Any]:
    """Settings of the S3 backend, each test under a prefix of its own."""
    return {
        "storage_backend": "s3",
        "storage_s3_bucket": "genqueue-test",
        "storage_s3_prefix": f"t-{uuid.uuid4().hex[:8]}/",
        "storage_s3_endpoint_url": moto.url,
        "storage_s3_region": MotoServer.REGION,
        "storage_s3_access_key_id": SecretStr(MotoServer.KEY_ID),
        "storage_s3_secret_access_key": SecretStr(MotoServer.SECRET),
        "storage_s3_part_bytes": PART,
        "video_model": f"{GEN}:NoisyVideo",
    }


def _objects(moto: MotoServer, prefix: str) -> dict[str, int]:
    """Every object under the prefix (relative key -> size)."""
    listing = moto.client().list_objects_v2(Bucket="genqueue-test", Prefix=prefix)
    return {o["Key"][len(prefix) :]: o["Size"] for o in listing.get("Contents", [])}


def _uploads(moto: MotoServer, prefix: str) -> list[str]:
    listing = moto.client().list_multipart_uploads(Bucket="genqueue-test", Prefix=prefix)
    return [u["Key"] for u in listing.get("Uploads", [])]


def _body(moto: MotoServer, key: str) -> bytes:
    return bytes(moto.client().get_object(Bucket="genqueue-test", Key=key)["Body"].read())


def _storage_env(overrides: dict[str, Any]) -> dict[str, str]:
    """The overrides as a worker subprocess reads them (GENQUEUE_STORAGE_S3_BUCKET=...)."""
    env = {}
    for name, value in overrides.items():
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        env[f"GENQUEUE_{name.upper()}"] = str(raw)
    return env


def _local(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def _submit(client: FlaskClient, prompt: str) -> str:
    resp = client.post("/v1/jobs", json={"prompt": prompt, "modality": "video", "params": VIDEO})
    assert resp.status_code == 202, resp.get_json()
    return str(resp.get_json()["id"])


def test_the_backend_is_chosen_by_settings_and_never_shows_its_credentials(settings, s3_overrides) -> None:
    assert isinstance(open_storage(settings), LocalStorage)
    store = open_storage(settings.model_copy(update=s3_overrides))
    assert isinstance(store, S3Storage)
    assert MotoServer.SECRET not in repr(store) and MotoServer.KEY_ID not in repr(store)
    with pytest.raises(ValueError, match="storage_s3_bucket"):
        open_storage(settings.model_copy(update={**s3_overrides, "storage_s3_bucket": ""}))
    assert not store.exists("../etc/passwd") and not store.exists("x/../../y")


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, settings, tmp_path) -> Any:
    """Each backend, empty: a fresh folder, or a fresh prefix in the bucket."""
    if request.param == "local":
        return open_storage(settings.model_copy(update={"artifact_dir": tmp_path / "artifacts"}))
    return open_storage(settings.model_copy(update=request.getfixturevalue("s3_overrides")))


def test_every_backend_keeps_the_same_contract(store: Any) -> None:
    """What web and workers rely on: whole writes, replacing rewrites, seekable reads, removal."""
    data = bytes(range(256)) * 1024  # 256 KiB: a multipart upload on S3 (64 KiB parts)
    assert store.stat("j1/video.mp4") is None and not store.exists("j1/video.mp4")
    with pytest.raises(FileNotFoundError):
        store.open("j1/video.mp4")
    with pytest.raises(RuntimeError), store.writing("j1/video.mp4", "video/mp4") as path:
        path.write_bytes(data[:1000])
        raise RuntimeError("the encoder failed")  # nothing is published
    assert not store.exists("j1/video.mp4")
    with store.writing("j1/video.mp4", "video/mp4") as path:
        path.write_bytes(data)
        assert not store.exists("j1/video.mp4")  # not visible before the block ends
    first = store.stat("j1/video.mp4")
    assert first is not None and first.size == len(data) and first.etag
    assert store.put("j1/video.mp4", data[::-1], "video/mp4") == len(data)  # a rewrite replaces it
    second = store.stat("j1/video.mp4")
    assert second is not None and second.etag != first.etag
    assert b"".join(store.read_range("j1/video.mp4", 1000, 70000)) == data[::-1][1000:71000]
    with store.open("j1/video.mp4") as f:
        f.seek(len(data) - 5)
        assert f.read() == data[::-1][-5:] and f.read() == b""
    store.put("j1/thumbnail.jpg", b"jpeg", "image/jpeg")
    store.put("j2/video.mp4", b"other job", "video/mp4")
    assert store.sweep("j1/") == 0  # nothing unfinished
    assert store.delete_prefix("j1/") >= 1 and store.delete_prefix("j1/") == 0
    assert not store.exists("j1/video.mp4") and not store.exists("j1/thumbnail.jpg")
    assert store.exists("j2/video.mp4")
    for bad in ("../j2/video.mp4", "/etc/passwd", "j2//video.mp4", "j2/./video.mp4", ""):
        assert store.stat(bad) is None
        with pytest.raises(KeyError):
            store.put(bad, b"x", "video/mp4")


def test_an_unreachable_bucket_is_a_transient_outage(settings, s3_overrides) -> None:
    """Retried by the workers (infra_retry) and a 503 from the API, like a database outage."""
    from tasks.contract.transient import is_transient
    from tests.support.procs import free_port

    dead = open_storage(
        settings.model_copy(
            update={**s3_overrides, "storage_s3_endpoint_url": f"http://127.0.0.1:{free_port()}"}
        )
    )
    with pytest.raises(ConnectionError) as raised:
        dead.put("x/video.mp4", b"data", "video/mp4")
    assert is_transient(raised.value)
    with pytest.raises(ConnectionError):
        dead.stat("x/video.mp4")


def test_a_video_job_on_s3_downloads_whole_by_range_and_by_links_then_delete_removes_it(
    make_app, settings, s3_overrides, moto
) -> None:
    prefix = s3_overrides["storage_s3_prefix"]
    keys = {"media_url_keys": SecretStr("s3-media-key")}
    app = make_app(**s3_overrides, **keys)
    presigning = make_app(**s3_overrides, **keys, storage_s3_presigned_links=True)
    client, anon = app.test_client(), FlaskClient(app, app.response_class)
    with thread_workers(settings, **s3_overrides):
        jid = _submit(client, "a lighthouse in fog")
        done = wait_finished(client, jid, timeout=60)
    assert done["status"] == "succeeded", done.get("error")
    objects = _objects(moto, prefix)
    assert sorted(objects) == [f"{jid}/thumbnail.jpg", f"{jid}/video.mp4"]
    assert objects[f"{jid}/video.mp4"] > 2 * PART  # it went up as a multipart upload
    assert _uploads(moto, prefix) == [] and files(settings.artifact_dir, uuid.UUID(jid)) == []
    data = _body(moto, f"{prefix}{jid}/video.mp4")

    whole = client.get(f"/v1/jobs/{jid}/content")
    assert whole.status_code == 200 and whole.mimetype == "video/mp4" and whole.data == data
    assert whole.headers["Accept-Ranges"] == "bytes" and int(whole.headers["Content-Length"]) == len(data)
    part = client.get(f"/v1/jobs/{jid}/content", headers={"Range": "bytes=70000-70099"})
    assert part.status_code == 206 and part.data == data[70000:70100]
    assert part.headers["Content-Range"] == f"bytes 70000-70099/{len(data)}"
    tail = client.get(f"/v1/jobs/{jid}/content", headers={"Range": "bytes=-10"})
    assert tail.status_code == 206 and tail.data == data[-10:]
    assert client.get(f"/v1/jobs/{jid}/content", headers={"Range": f"bytes={len(data)}-"}).status_code == 416
    head = client.head(f"/v1/jobs/{jid}/content")  # a HEAD request: no GET of the object
    assert head.status_code == 200 and head.data == b"" and head.headers["Content-Length"] == str(len(data))
    etag = whole.headers["ETag"]
    assert client.get(f"/v1/jobs/{jid}/content", headers={"If-None-Match": etag}).status_code == 304
    thumb = client.get(f"/v1/jobs/{jid}/content?variant=thumbnail")
    assert thumb.status_code == 200 and thumb.data.startswith(b"\xff\xd8")

    links = done["outputs"]
    signed = anon.get(_local(links["video_signed_url"]), headers={"Range": "bytes=0-9"})
    assert signed.status_code == 206 and signed.data == data[:10]
    redirected = FlaskClient(presigning, presigning.response_class).get(_local(links["video_signed_url"]))
    assert redirected.status_code == 302
    presigned = redirected.headers["Location"]
    assert presigned.startswith(moto.url) and "X-Amz-Signature" in presigned
    got = httpx.get(presigned)
    assert got.status_code == 200 and got.content == data and got.headers["content-type"] == "video/mp4"
    ranged = httpx.get(presigned, headers={"Range": "bytes=5-14"})
    assert ranged.status_code == 206 and ranged.content == data[5:15]

    assert client.delete(f"/v1/jobs/{jid}").status_code == 204
    assert _objects(moto, prefix) == {}
    assert client.get(f"/v1/jobs/{jid}/content").status_code == 410
    assert anon.get(_local(links["video_signed_url"])).status_code == 410


def test_an_image_job_on_s3_serves_each_image_its_cached_copy_and_links_then_delete_removes_them(
    make_app, settings, s3_overrides, moto
) -> None:
    """PNGs, WebPs and the thumbnail go through the storage interface as a video does."""
    prefix = s3_overrides["storage_s3_prefix"]
    keys = {"media_url_keys": SecretStr("s3-media-key")}
    client = make_app(**s3_overrides, **keys).test_client()
    presigning = make_app(**s3_overrides, **keys, storage_s3_presigned_links=True)
    params = {"width": 64, "height": 96, "steps": 2, "seed": 5, "num_images": 2}
    body = {"prompt": "a lighthouse at dusk", "modality": "image", "params": params}
    with thread_workers(settings, **s3_overrides):
        done = wait_finished(client, client.post("/v1/jobs", json=body).get_json()["id"], timeout=60)
        assert done["status"] == "succeeded", done.get("error")
        copy = client.post("/v1/jobs", json=body).get_json()  # its first PNG exists: a cache hit
    jid = done["id"]
    assert copy["cached"] is True and copy["status"] == "succeeded"
    names = ["thumbnail.jpg", *(f"image-{k}.{fmt}" for k in range(2) for fmt in ("png", "webp"))]
    assert sorted(_objects(moto, prefix)) == sorted(f"{jid}/{n}" for n in names)
    assert _uploads(moto, prefix) == [] and files(settings.artifact_dir, uuid.UUID(jid)) == []
    for image in done["outputs"]["images"]:
        for fmt in ("png", "webp"):
            data = _body(moto, f"{prefix}{jid}/image-{image['index']}.{fmt}")
            got = client.get(image[f"{fmt}_url"])
            assert (got.status_code, got.mimetype, got.data) == (200, f"image/{fmt}", data)
    webp = _body(moto, f"{prefix}{jid}/image-1.webp")
    assert client.get(f"/v1/jobs/{copy['id']}/content?variant=image&index=1&format=webp").data == webp
    assert client.get(f"/v1/jobs/{jid}/content?variant=image&index=2").status_code == 404
    thumb = client.get(done["outputs"]["thumbnail_url"])
    assert thumb.status_code == 200 and thumb.data.startswith(b"\xff\xd8")
    link = _local(done["outputs"]["images"][1]["webp_signed_url"])
    redirected = FlaskClient(presigning, presigning.response_class).get(link)
    assert redirected.status_code == 302
    got = httpx.get(redirected.headers["Location"])
    assert (got.status_code, got.headers["content-type"], got.content) == (200, "image/webp", webp)

    assert client.delete(f"/v1/jobs/{jid}").status_code == 204
    assert _objects(moto, prefix) == {}
    assert client.get(done["outputs"]["images"][0]["png_url"]).status_code == 410


def test_retention_removes_the_objects_and_the_cache_skips_a_source_whose_object_is_gone(
    make_app, settings, sessions, s3_overrides, moto
) -> None:
    prefix = s3_overrides["storage_s3_prefix"]
    client = make_app(**s3_overrides).test_client()
    body = {"prompt": "a kite", "modality": "video", "params": {**VIDEO, "seed": 3}}
    with thread_workers(settings, **s3_overrides):
        first = wait_finished(client, client.post("/v1/jobs", json=body).get_json()["id"], timeout=60)
        copy = client.post("/v1/jobs", json=body).get_json()  # the object exists: a cache hit
        assert copy["cached"] is True and copy["status"] == "succeeded"
        moto.client().delete_object(Bucket="genqueue-test", Key=f"{prefix}{first['id']}/video.mp4")
        recomputed = client.post("/v1/jobs", json=body).get_json()  # gone: computed afresh
        assert recomputed["cached"] is False
        again = wait_finished(client, recomputed["id"], timeout=60)
    assert again["status"] == "succeeded" and f"{again['id']}/video.mp4" in _objects(moto, prefix)
    with transaction(sessions) as s:
        s.execute(
            update(Job)
            .where(Job.id == uuid.UUID(again["id"]))
            .values(completed_at=utcnow() - timedelta(days=30))
        )
    rt = Runtime(
        settings.model_copy(update={**s3_overrides, "retention_s": 7 * 24 * 3600}),
        sessions.kw["bind"], sessions, os.getpid(),
    )  # fmt: skip
    assert retention_task.expire(rt) >= 1
    assert not any(k.startswith(again["id"]) for k in _objects(moto, prefix))
    assert get(sessions, uuid.UUID(again["id"])).data_removed_at is not None


def test_compensation_removes_a_failed_jobs_objects_and_its_unfinished_upload(
    settings, sessions, s3_overrides, moto
) -> None:
    from models import states
    from tasks import compensation
    from tests.support.jobs import create_job

    prefix = s3_overrides["storage_s3_prefix"]
    rt = Runtime(settings.model_copy(update=s3_overrides), sessions.kw["bind"], sessions, os.getpid())
    jid = create_job(sessions)
    rt.storage.put(f"{jid}/thumbnail.jpg", b"jpeg", "image/jpeg")  # what a dying attempt left
    moto.client().create_multipart_upload(Bucket="genqueue-test", Key=f"{prefix}{jid}/video.mp4")
    with transaction(sessions) as s:
        states.fail(s, jid, "internal_error", "the render crashed", "video")
    assert compensation.compensate_job(rt, jid)
    assert _objects(moto, f"{prefix}{jid}/") == {} and _uploads(moto, f"{prefix}{jid}/") == []
    [event] = event_rows(sessions, jid, "job.compensated")
    assert event.data["files_removed"] is True


@pytest.mark.slow
def test_a_worker_killed_mid_upload_leaves_no_partial_object_and_the_job_completes_once(
    settings, sessions, broker, s3_overrides, moto, tmp_path
) -> None:
    """SIGKILL the video pool child after the first part of the MP4's multipart upload: no
    object is visible (the thumbnail, uploaded before, is whole), the message goes back, the
    redelivery uploads the same keys again, and the sweep aborts the dead upload."""
    prefix = s3_overrides["storage_s3_prefix"]
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    s3_settings = settings.model_copy(update={**s3_overrides, "video_model": f"{GEN}:UploadPausingVideo"})
    env = _storage_env(s3_overrides) | {
        "GENQUEUE_VIDEO_MODEL": f"{GEN}:UploadPausingVideo",
        "GENQUEUE_TEST_PAUSE_DIR": str(pauses),
    }
    workers = [
        Worker(worker_env(s3_settings, **env), "text,default", tmp_path, "text", "threads", 2),
        Worker(worker_env(s3_settings, **env), "video", tmp_path, "video"),
    ]
    try:
        for w in workers:
            w.start()
        from tasks.celery_app import create_celery
        from tests.support.jobs import submit

        jid = submit(sessions, create_celery(s3_settings, set_as_current=False), **VIDEO)
        marker = pauses / f"{jid}.uploading"
        wait_for(lambda: marker.exists() and marker.read_text(), 120, what="the upload to pause")
        assert _objects(moto, prefix).keys() == {f"{jid}/thumbnail.jpg"}  # no partial video
        assert _uploads(moto, prefix) == [f"{prefix}{jid}/video.mp4"]  # half sent, invisible
        os.kill(int(marker.read_text()), signal.SIGKILL)  # reject_on_worker_lost: redelivered
        job = wait_done(sessions, jid, timeout=180)
    finally:
        for w in workers:
            w.stop()
    assert job.status == "succeeded", (job.error_code, job.error_message)
    assert job.attempts == 2 and len(event_rows(sessions, jid, "job.succeeded")) == 1
    objects = _objects(moto, prefix)
    assert sorted(objects) == [f"{jid}/thumbnail.jpg", f"{jid}/video.mp4"]  # the same keys, once
    assert objects[f"{jid}/video.mp4"] == job.artifact_bytes
    assert _uploads(moto, prefix) == []  # the killed attempt's upload was aborted by the sweep
    assert not list(Path(settings.artifact_dir).glob(f"{jid}*"))
