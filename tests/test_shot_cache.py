"""The shot cache through the API and real workers: an identical shot renders once, each job its own file."""

from __future__ import annotations

import uuid

from sqlalchemy import update

from models import shot_cache
from models.base import utcnow
from models.db import transaction
from models.job import Job
from models.job_shots import JobShot, ShotStatus
from models.tenant import Tenant
from tasks.contract import names
from tests.support import generators
from tests.support.api import submit, wait_finished
from tests.support.jobs import event_rows, files
from tests.support.workers import thread_workers

GEN = "tests.support.generators"
SMALL = {"width": 64, "height": 64, "num_frames": 5, "fps": 6, "steps": 2, "seed": 11}


def _prompt(marker: str) -> str:
    return f"{marker} A kite rises over the dunes. {marker} The string snaps. {marker} It lands in the sea."


def _storyboard(client, marker: str, cache: bool = True, **params):
    body = {"enhance_prompt": False, "shots": 3} | SMALL | params
    resp = submit(client, prompt=_prompt(marker), modality="storyboard", params=body, cache=cache)
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["id"]


def _renders(marker: str) -> int:
    return sum(1 for r in generators.runs(marker) if r.outcome == "finished")


def test_an_identical_storyboard_copies_every_shot_into_its_own_files(client, settings, sessions) -> None:
    marker = f"[{uuid.uuid4().hex[:8]}]"
    with thread_workers(settings, video_model=f"{GEN}:TracedVideo"):
        first = wait_finished(client, _storyboard(client, marker), timeout=90)
        assert first["status"] == "succeeded", first["error"]
        assert _renders(marker) == 3
        second = wait_finished(client, _storyboard(client, marker), timeout=90)
    assert second["status"] == "succeeded", second["error"]
    assert _renders(marker) == 3  # nothing rendered again
    assert [s["cached"] for s in first["storyboard"]["shots"]] == [False] * 3
    shots = second["storyboard"]["shots"]
    assert [(s["cached"], s["seconds"], s["attempts"]) for s in shots] == [(True, 0.0, 1)] * 3
    for a, b in zip(first["storyboard"]["shots"], shots, strict=True):
        assert client.get(a["video_url"]).data == client.get(b["video_url"]).data  # the same frames
    film_a, film_b = (client.get(j["outputs"]["video_url"]).data for j in (first, second))
    assert film_a == film_b  # and the same film, stitched from them
    jid = uuid.UUID(second["id"])  # the copies are the second job's own objects
    assert {names.shot_name(i) for i in range(3)} <= set(files(settings.artifact_dir, jid))
    completed = event_rows(sessions, jid, "job.shot.completed")
    assert [e.data["cached"] for e in completed] == [True] * 3
    with sessions() as s:
        sources = {r.source_job_id for r in s.query(JobShot).filter(JobShot.job_id == jid)}
    assert sources == {uuid.UUID(first["id"])}


def test_cache_false_another_seed_or_no_seed_renders_its_shots(client, settings) -> None:
    marker = f"[{uuid.uuid4().hex[:8]}]"
    with thread_workers(settings, video_model=f"{GEN}:TracedVideo"):
        done = [wait_finished(client, _storyboard(client, marker), timeout=90)]
        done.append(wait_finished(client, _storyboard(client, marker, cache=False), timeout=90))
        done.append(wait_finished(client, _storyboard(client, marker, seed=12), timeout=90))
        done.append(wait_finished(client, _storyboard(client, marker, seed=None), timeout=90))
    assert [d["status"] for d in done] == ["succeeded"] * 4
    assert _renders(marker) == 12
    assert not any(s["cached"] for d in done for s in d["storyboard"]["shots"])


def test_two_identical_storyboards_at_once_render_each_shot_once(client, settings, monkeypatch) -> None:
    """The second's shots find the first's renders under way and wait for them (or the reverse)."""
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.4")
    marker = f"[{uuid.uuid4().hex[:8]}]"
    with thread_workers(settings, video_model=f"{GEN}:TracedVideo", shot_cache_wait_s=0.2):
        ids = [_storyboard(client, marker), _storyboard(client, marker)]
        done = [wait_finished(client, jid, timeout=120) for jid in ids]
    assert [d["status"] for d in done] == ["succeeded", "succeeded"], [d["error"] for d in done]
    assert _renders(marker) == 3
    for index in range(3):  # each shot: rendered by one job, copied by the other
        cached = sorted(d["storyboard"]["shots"][index]["cached"] for d in done)
        assert cached == [False, True]
    assert all(s["attempts"] == 1 for d in done for s in d["storyboard"]["shots"])  # waits are no attempts


def test_lookup_keeps_to_the_tenant_and_ignores_ended_jobs_and_dead_claims(settings, sessions) -> None:
    tenant_a, tenant_b = uuid.uuid4(), uuid.uuid4()
    key = "ab" * 32
    with transaction(sessions) as s:
        s.add_all([Tenant(id=tenant_a, name="acme", plan={}), Tenant(id=tenant_b, name="bolt", plan={})])
    jobs = {}
    with transaction(sessions) as s:
        for name, tenant in (("done", tenant_a), ("other", tenant_a), ("rival", tenant_b)):
            job = Job(modality="storyboard", prompt="p", params={}, tenant_id=tenant, status="running")
            s.add(job)
            s.flush()
            jobs[name] = job.id
            s.add(JobShot(job_id=job.id, idx=0, description="d", status=ShotStatus.QUEUED))
        s.flush()
        s.execute(
            update(JobShot)
            .where(JobShot.job_id == jobs["done"])
            .values(status=ShotStatus.SUCCEEDED, cache_key=key, artifact_path="x/shot-000.mp4", frames=5)
        )
    long_ago = utcnow().replace(year=2000)
    with transaction(sessions) as s:  # tenant b never sees tenant a's shot, and claims the key
        found = shot_cache.lookup(s, key, tenant_b, jobs["rival"], 0, long_ago)
    assert (found.source, found.busy) == (None, False)
    with transaction(sessions) as s:
        found = shot_cache.lookup(s, key, tenant_a, jobs["other"], 0, long_ago)
    assert found.source is not None and found.source.job_id == jobs["done"]
    with transaction(sessions) as s:  # a failed job's shots are not reused (compensation removes them)
        s.execute(update(Job).where(Job.id == jobs["done"]).values(status="failed"))
        s.execute(update(JobShot).where(JobShot.job_id == jobs["other"]).values(status=ShotStatus.RUNNING))
    with transaction(sessions) as s:
        found = shot_cache.lookup(s, key, tenant_a, jobs["other"], 0, long_ago)
    assert (found.source, found.busy) == (None, False)  # and it claimed the key itself
    with sessions() as s:
        assert s.get(JobShot, (jobs["other"], 0)).cache_key == key
    # A third shot of tenant a: "other" renders (running, fresh) -> busy; a stale claim is not.
    with transaction(sessions) as s:
        job = Job(modality="storyboard", prompt="p", params={}, tenant_id=tenant_a, status="running")
        s.add(job)
        s.flush()
        s.add(JobShot(job_id=job.id, idx=0, description="d", status=ShotStatus.RUNNING))
        third = job.id
    with transaction(sessions) as s:
        assert shot_cache.lookup(s, key, tenant_a, third, 0, long_ago).busy
    with transaction(sessions) as s:
        assert not shot_cache.lookup(s, key, tenant_a, third, 0, utcnow()).busy
