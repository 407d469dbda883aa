"""The job state machine: conditional transitions never move a job backwards or finish it twice."""
from __future__ import annotations

import uuid

from sqlalchemy import func, select

from models import Job, JobEvent, JobStatus, Stage, states
from models.db import transaction


def _job(sessions, modality: str = "video") -> uuid.UUID:
    with transaction(sessions) as s:
        job = Job(modality=modality, prompt="a cat", params={})
        s.add(job)
        s.flush()
        return job.id


def _events(sessions, jid: uuid.UUID) -> list[str]:
    with sessions() as s:
        return list(s.scalars(select(JobEvent.type).where(JobEvent.job_id == jid).order_by(JobEvent.id)))


def test_happy_path_video(sessions) -> None:
    jid = _job(sessions)
    with transaction(sessions) as s:
        assert states.mark_published(s, jid)
        assert states.start_text(s, jid)
        assert states.complete_text(s, jid, "shot", 0.1, final=False, progress=20)
        assert states.set_progress(s, jid, Stage.VIDEO, 50)
        assert states.complete_video(s, jid, "x/video.mp4", 10, 0.2)
    with sessions() as s:
        job = s.get(Job, jid)
        assert (job.status, job.stage, job.progress, job.output_text) == ("succeeded", "video", 100, "shot")
        assert job.completed_at is not None and job.text_completed_at is not None
    assert _events(sessions, jid) == ["job.started", "job.text.completed", "job.succeeded"]


def test_text_job_succeeds_after_text(sessions) -> None:
    jid = _job(sessions, "text")
    with transaction(sessions) as s:
        states.start_text(s, jid)
        assert states.complete_text(s, jid, "out", 0.1, final=True, progress=20)
    with sessions() as s:
        assert s.get(Job, jid).status == JobStatus.SUCCEEDED
    assert _events(sessions, jid) == ["job.started", "job.text.completed", "job.succeeded"]


def test_no_double_transitions(sessions) -> None:
    jid = _job(sessions)
    with transaction(sessions) as s:
        assert states.start_text(s, jid)
        assert not states.start_text(s, jid), "a second start is not a transition"
        assert states.complete_text(s, jid, "shot", 0.1, final=False, progress=20)
        assert not states.complete_text(s, jid, "again", 0.1, final=False, progress=20)
        assert states.complete_video(s, jid, "x", 1, 0.1)
        assert not states.complete_video(s, jid, "x", 1, 0.1), "finished twice"
        assert not states.fail(s, jid, "boom", "late failure", "video")
        assert not states.cancel(s, jid)
    with sessions() as s:
        assert s.get(Job, jid).output_text == "shot"
        n = s.scalar(select(func.count()).select_from(JobEvent).where(JobEvent.type == "job.succeeded"))
        assert n == 1


def test_no_backwards_transitions(sessions) -> None:
    jid = _job(sessions)
    with transaction(sessions) as s:
        states.start_text(s, jid)
        states.complete_text(s, jid, "shot", 0.1, final=False, progress=20)
        # A redelivered text task cannot take the job back to the text stage.
        assert not states.resume_stage(s, jid, Stage.TEXT)
        assert not states.start_text(s, jid)
        assert states.resume_stage(s, jid, Stage.VIDEO)
        assert not states.set_progress(s, jid, Stage.VIDEO, 10), "progress never goes down"
    with sessions() as s:
        job = s.get(Job, jid)
        assert (job.status, job.stage, job.progress) == ("running", "video", 20)


def test_cancel_and_fail_only_active(sessions) -> None:
    queued, running = _job(sessions), _job(sessions)
    with transaction(sessions) as s:
        states.start_text(s, running)
        assert states.cancel(s, queued)
        assert not states.start_text(s, queued), "a canceled job never starts"
        assert states.fail(s, running, "oops", "it broke", "text")
        assert not states.cancel(s, running)
        assert not states.complete_text(s, running, "late", 0.1, final=True, progress=20)
    with sessions() as s:
        q, r = s.get(Job, queued), s.get(Job, running)
        assert q.status == "canceled" and q.error_code == "canceled"
        assert (r.status, r.error_code, r.error_stage) == ("failed", "oops", "text")


def test_stage_entry_sets_the_deadline_in_its_update_only_within_max_attempts(sessions) -> None:
    from models.recovery import deadline_in, entry_deadline

    jid = _job(sessions)
    with transaction(sessions) as s:
        job = states.start_text(s, jid, deadline_at=entry_deadline(600, 2))
        assert job is not None and (job.status, job.attempts) == ("running", 1)
        first = job.deadline_at
        assert first is not None and first > deadline_in(500)
    with transaction(sessions) as s:
        job = states.resume_stage(s, jid, Stage.TEXT, deadline_at=entry_deadline(6000, 2))
        assert job is not None and job.attempts == 2 and job.deadline_at > deadline_in(5000)
        second = job.deadline_at
    with transaction(sessions) as s:  # a third entry is past the maximum: the stage fails instead
        job = states.resume_stage(s, jid, Stage.TEXT, deadline_at=entry_deadline(60000, 2))
        assert job is not None and job.attempts == 3 and job.deadline_at == second
        assert states.resume_stage(s, jid, Stage.VIDEO) is None  # not in that stage: no row
    with transaction(sessions) as s:
        later = deadline_in(90)
        assert states.complete_text(s, jid, "shot", 0.1, final=False, progress=20, deadline_at=later)
    with sessions() as s:
        assert s.get(Job, jid).deadline_at == later
    assert _events(sessions, jid) == ["job.started", "job.text.completed"]


def test_an_attempt_is_charged_once_whether_or_not_its_completion_happens(sessions) -> None:
    jid = _job(sessions)
    with transaction(sessions) as s:
        states.start_text(s, jid)
        assert states.complete_text(
            s, jid, "shot", 0.1, final=False, progress=20, tokens=3, charge=states.Charge(0.25, "m")
        )
        states.charge_attempt(s, jid, Stage.VIDEO, states.Charge(0.5, "v"))  # a retried attempt
        assert states.cancel(s, jid)
        # Overtaken by the cancel: the transition does not happen, the GPU time still counts.
        done = states.complete_video(s, jid, "x", 1, 0.1, frames=5, charge=states.Charge(0.75, "v2"))
        assert not done
    with sessions() as s:
        job = s.get(Job, jid)
        assert (job.text_gpu_s, job.text_model, job.tokens_generated) == (0.25, "m", 3)
        assert (job.video_gpu_s, job.video_model, job.frames_rendered) == (1.25, "v2", None)


def test_a_shaped_transition_reuses_its_statement_and_binds_each_calls_values(sessions) -> None:
    """models.transition_sql: a transition's UPDATE is built once per shape; what differs between
    calls (the job, the deadline, the GPU seconds added) must be each call's own."""
    from datetime import timedelta

    from models.recovery import entry_deadline
    from models.transition_sql import statement

    first, second = _job(sessions), _job(sessions)
    with transaction(sessions) as s:
        a = states.start_text(s, first, deadline_at=entry_deadline(60, 3))
        b = states.start_text(s, second, deadline_at=entry_deadline(3600, 3))
        assert a is not None and b is not None and a.id == first and b.id == second
        assert timedelta(minutes=58) < b.deadline_at - a.deadline_at < timedelta(minutes=60)
        for gpu_s in (0.25, 0.5):
            states.charge_attempt(s, first, Stage.TEXT, states.Charge(gpu_s, "echo"))
        states.charge_attempt(s, second, Stage.TEXT, states.Charge(2.0, "other"))
    with sessions() as s:
        rows = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_([first, second])))}
    assert (rows[first].text_gpu_s, rows[first].text_model) == (0.75, "echo")
    assert (rows[second].text_gpu_s, rows[second].text_model) == (2.0, "other")
    one, p1 = statement(first, Job.status == "x", {"progress": 1}, shape="test-shape")
    two, p2 = statement(second, Job.status == "y", {"progress": 2}, shape="test-shape")
    assert one is two  # built once: the shape's first WHERE, its values bound per call
    assert (p1["transition_job_id"], p1["set_progress"]) == (first, 1)
    assert (p2["transition_job_id"], p2["set_progress"]) == (second, 2)


def test_a_stage_past_its_attempts_keeps_its_deadline(sessions) -> None:
    """entry_deadline's bound `case()`: within max_attempts the new deadline, past it the old one."""
    from models.recovery import entry_deadline

    jid = _job(sessions)
    with transaction(sessions) as s:
        started = states.start_text(s, jid, deadline_at=entry_deadline(60, 1))
        assert started is not None and started.deadline_at is not None
        kept = started.deadline_at
        again = states.resume_stage(s, jid, Stage.TEXT, deadline_at=entry_deadline(3600, 1))
        assert again is not None and again.attempts == 2 and again.deadline_at == kept
