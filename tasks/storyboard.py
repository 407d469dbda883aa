"""A storyboard's tasks: its shots fan out as one Celery group on the video queue, then one stitch.

The text stage (tasks.pipeline) wrote the shot list and one job_shots row per shot. start_shots
(the last link of the job's chain, on the default queue) sends a group of render_shot tasks, one
per unfinished shot, so every free video worker takes one. Each shot renders like a video stage
(the video model, batching, cancel checks, retries) and commits its file and its completion; the
completion that finishes the set moves the job to its stitch stage in that same transaction
(models.shot_states) and then sends stitch_shots. Nothing waits in a worker for the others, and
no result backend is needed: the database is the chord's counter. If a worker dies between that
commit and the send, the job sits in its stitch stage past its deadline and the reaper sends the
stitch again; if the fan-out itself was lost, the reaper resends start_shots, which sends only
the shots still unfinished (or the stitch, when none is).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import av
from celery import Task, group, shared_task
from celery.exceptions import Ignore

from models import Job, JobStatus, Stage, recovery, shot_states, states
from models.db import transaction
from models.job_shots import JobShot
from models.recovery import deadline_in
from models.shot_states import ShotDone
from models.storage import Storage
from tasks import compensation, failures, job_models, metrics, model_swaps, outcome, shot_cache
from tasks.batching import Meter, run_batched
from tasks.contract import names
from tasks.contract.publish import publish_job
from tasks.contract.routing import broker_priority
from tasks.generators.base import VideoRequest
from tasks.media import encode_mp4, write_thumbnail
from tasks.outcome import Outcome
from tasks.pipeline import enter_stage, video_request
from tasks.runtime import Runtime, runtime
from tasks.stitch import contact_sheet, stitch_mp4
from tasks.watch import JobWatch

log = logging.getLogger(__name__)


def _shot_wait_s(rt: Runtime) -> float:
    """How long a storyboard may go without a shot starting or finishing: one shot's limit, and
    the wait in the video queue for the next."""
    s_ = rt.settings
    return failures.hard_limit(s_, Stage.VIDEO) + s_.stage_grace_s + s_.queued_timeout_s


def _send_stitch(rt: Runtime, app: Any, job_id: uuid.UUID) -> None:
    """After the commit that moved the job to its stitch: send it (a loss is the reaper's)."""
    with rt.sessions() as s:
        job = s.get(Job, job_id)
        if job is None:
            return
        modality, priority = job.modality, job.priority
    try:
        publish_job(app, job_id, modality, priority, stage=Stage.STITCH)
    except Exception as exc:  # the job waits in its stitch stage; its deadline brings the reaper
        log.warning("job %s: stitch not sent (the reaper will): %s", job_id, exc)


@shared_task(bind=True, name=names.START_SHOTS)
def start_shots(self: Task[[str], None], job_id: str) -> None:
    """Fan the storyboard's unfinished shots out as one group of render_shot tasks."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    with failures.infra_retry(self, rt, jid, Stage.SHOTS):
        job = enter_stage(rt, jid, Stage.SHOTS)
        if job is None:
            return
        with transaction(rt.sessions) as s:
            pending = shot_states.unfinished(s, jid)
            stitch = not pending and shot_states.to_stitch(s, jid, deadline_in(rt.settings.queued_timeout_s))
            if pending:  # the shots' wait: queued behind other jobs, then rendered (each pushes it out)
                recovery.set_deadline(s, jid, _shot_wait_s(rt))
        if stitch:
            _send_stitch(rt, self.app, jid)
            return
        prio = broker_priority(job.priority, self.app.conf.broker_url)  # the storyboard's priority
        shots = group(
            self.app.signature(
                names.RENDER_SHOT, args=(job_id, index), immutable=True,
                task_id=names.shot_task_id(job_id, index), priority=prio,
            )
            for index in pending
        )  # fmt: skip
        shots.apply_async()
        log.info("job %s: %d shots sent", jid, len(pending))


class ShotWatch(JobWatch):
    """JobWatch for one shot: progress goes to the shot (and the job's mean of its shots)."""

    def __init__(self, rt: Runtime, job_id: uuid.UUID, index: int) -> None:
        super().__init__(rt, job_id, Stage.SHOTS, progress_from=0, progress_to=99)
        self.index = index

    def on_step(self, step: int, total: int) -> None:
        now = time.monotonic()
        if now - self._last_progress < self.interval:
            return
        self._last_progress = now
        progress = 99 * step // max(total, 1)
        try:
            with transaction(self.rt.sessions) as s:
                shot_states.set_progress(s, self.job_id, self.index, progress)
        except Exception as exc:  # advisory, like JobWatch's
            log.warning(
                "job %s shot %d progress not recorded: %s", self.job_id, self.index, type(exc).__name__
            )


def _shot_request(job: Job, shot: JobShot, rt: Runtime) -> VideoRequest:
    """The job's video params with the shot's description; each shot its own (reproducible) seed."""
    base = video_request(job, rt.settings)
    seed = None if base.seed is None else (int(base.seed) + shot.idx) % 2**32
    return VideoRequest(
        prompt=shot.description, width=base.width, height=base.height, num_frames=base.num_frames,
        fps=base.fps, steps=base.steps, seed=seed,
    )  # fmt: skip


@shared_task(bind=True, name=names.RENDER_SHOT)
def render_shot(self: Task[[str, int], None], job_id: str, index: int) -> None:
    """Render one shot to its MP4; the last shot done sends the stitch."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    with failures.infra_retry(self, rt, jid, Stage.SHOTS):
        _render_shot(self, rt, jid, int(index))


def _render_shot(self: Task[[str, int], None], rt: Runtime, jid: uuid.UUID, index: int) -> None:
    s_ = rt.settings
    with transaction(rt.sessions) as s:
        shot = shot_states.enter(s, jid, index, deadline_in(_shot_wait_s(rt)))
        job = s.get(Job, jid) if shot is not None else None
    if shot is None or job is None:
        log.info("job %s shot %d: nothing to do (done, or the job moved on)", jid, index)
        return
    if shot.attempts > s_.max_stage_attempts:  # its worker keeps dying: give up on the job
        message = f"shot {index} gave up after {shot.attempts - 1} attempts"
        compensation.fail_and_compensate(rt, jid, "too_many_attempts", message, Stage.SHOTS)
        return
    request = _shot_request(job, shot, rt)
    models = model_swaps.effective(s_)
    model = job_models.to_run(job, Stage.VIDEO, models)
    spec, meter = job_models.spec(models, Stage.VIDEO, model), Meter()
    key = shot_cache.key_of(job, request, models, model)
    turn = shot_cache.take_turn(self, rt, job, index, key) if key is not None else shot_cache.Turn()
    if turn.waiting:
        return
    if turn.copied is not None:
        shot_file, size, source = turn.copied
        ran = job_models.ran(job, Stage.VIDEO, model, spec)  # the key holds the version: it ran
        done = ShotDone(shot_file, size, source.frames, 0.0, states.Charge(0.0, model, ran), source.job_id)
        _completed(self, rt, jid, index, done)
        return
    watch = ShotWatch(rt, jid, index)
    started = time.monotonic()
    try:
        result = run_batched(
            self, s_, Stage.VIDEO, request,
            should_cancel=watch.canceled, on_progress=watch.on_step, model=spec, meter=meter,
        )  # fmt: skip
        if result.error is not None:
            raise result.error
        shot_file, size = _write_shot(rt.storage, jid, index, result.frames, result.fps)
    except Exception as exc:
        charge = states.Charge(meter.seconds, model, job_models.ran(job, Stage.VIDEO, model, spec))
        with transaction(rt.sessions) as s:
            states.charge_attempt(s, jid, Stage.SHOTS, charge)
        try:
            failures.handle(self, rt, job, Stage.SHOTS, exc, attempts=shot.attempts)
        except Ignore:  # canceled, or failed for good: a failure is this shot's to show
            _note_failure(rt, jid, index)
            raise
    charge = states.Charge(meter.seconds, model, job_models.ran(job, Stage.VIDEO, model, spec))
    seconds = round(time.monotonic() - started, 3)
    done = ShotDone(shot_file, size, int(result.frames.shape[0]), seconds, charge)
    _completed(self, rt, jid, index, done)


def _completed(self: Task[[str, int], None], rt: Runtime, jid: uuid.UUID, index: int, done: ShotDone) -> None:
    """Commit the shot's completion; the last one sends the stitch."""
    s_ = rt.settings
    with transaction(rt.sessions) as s:
        completed, last = shot_states.complete(s, jid, index, done, deadline_in(s_.queued_timeout_s))
    if completed:
        if done.source_job_id is None:  # a copy rendered nothing
            metrics.metrics().stage_duration.labels(Stage.VIDEO).observe(done.seconds)
    elif not compensation.is_succeeded(rt, jid):
        outcome.settle(rt, jid, Outcome.OVERTAKEN)  # canceled or failed meanwhile: its files go
    if last:
        _send_stitch(rt, self.app, jid)


def _note_failure(rt: Runtime, jid: uuid.UUID, index: int) -> None:
    """The job failed on this shot: the shot shows the job's error (a cancel leaves it as it was)."""
    with transaction(rt.sessions) as s:
        job = s.get(Job, jid)
        if job is not None and job.status == JobStatus.FAILED:
            shot_states.record_failure(s, jid, index, job.error_code or "failed", job.error_message or "")


def _write_shot(storage: Storage, jid: uuid.UUID, index: int, frames: Any, fps: int) -> tuple[str, int]:
    """The shot's MP4 under its fixed key: a redelivery rewrites the same object."""
    key = names.artifact_key(jid, names.shot_name(index))
    with storage.writing(key, "video/mp4") as path:
        info = encode_mp4(frames, fps, str(path))
    return key, int(info["bytes"])


@shared_task(bind=True, name=names.STITCH_SHOTS)
def stitch_shots(self: Task[[str], None], job_id: str) -> None:
    """Join the storyboard's shots into one MP4, with a thumbnail and a contact sheet."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    with failures.infra_retry(self, rt, jid, Stage.STITCH):
        job = enter_stage(rt, jid, Stage.STITCH)
        if job is None:
            outcome.settle(rt, jid, Outcome.SKIPPED)
            return
        with rt.sessions() as s:
            shots = shot_states.of_job(s, jid)
        started = time.monotonic()
        try:
            key, size, frames = _stitch(rt.storage, jid, shots, int((job.params or {}).get("fps", 8)))
        except Exception as exc:
            failures.handle(self, rt, job, Stage.STITCH, exc)
        shot_seconds, _ = shot_states.totals(shots)
        seconds = round(shot_seconds + time.monotonic() - started, 3)
        with transaction(rt.sessions) as s:
            done = states.complete_render(s, jid, Stage.STITCH, key, size, seconds, frames)
        outcome.settle(rt, jid, Outcome.COMPLETED if done else Outcome.OVERTAKEN)


def _stitch(storage: Storage, jid: uuid.UUID, shots: list[JobShot], fps: int) -> tuple[str, int, int]:
    """(the film's key, bytes of the film, thumbnail and sheet, its frames), from the shots' files."""
    folder = Path(tempfile.mkdtemp(prefix="genqueue-stitch-"))
    try:
        inputs = []
        for shot in shots:
            if shot.artifact_path is None:
                raise ValueError(f"shot {shot.idx} has no file")
            local = folder / names.shot_name(shot.idx)
            with storage.open(shot.artifact_path) as src, local.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            inputs.append(str(local))
        sheet_key = names.artifact_key(jid, names.CONTACT_SHEET_NAME)
        with storage.writing(sheet_key, "image/jpeg") as path:
            sheet = contact_sheet(inputs, str(path))
        key = names.artifact_key(jid, names.VIDEO_NAME)
        film = folder / names.VIDEO_NAME
        info = stitch_mp4(inputs, str(film), fps)
        thumb_key = names.artifact_key(jid, names.THUMBNAIL_NAME)
        with storage.writing(thumb_key, "image/jpeg") as path:
            _thumbnail(inputs[len(inputs) // 2], str(path))
        # The film last: once it exists, everything a download may ask for does.
        with storage.writing(key, "video/mp4") as path, film.open("rb") as src, path.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        return key, int(info["bytes"]) + int(sheet["bytes"]), int(info["frames"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _thumbnail(shot: str, path: str) -> None:
    """The middle shot's middle frame as the film's JPEG thumbnail (one shot decoded, not the film)."""
    with av.open(shot) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    write_thumbnail(frames[len(frames) // 2], path)
