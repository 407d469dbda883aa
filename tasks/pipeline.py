"""The pipeline tasks: generate_text -> generate_video | generate_image, and compensate on failure.

Every task takes a job id, reads what it needs from the database, and records its
outcome through the conditional transitions in models.states, so a redelivered or
duplicated message finds the job already past that point and does nothing.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Task, shared_task
from sqlalchemy.orm import Session

from models import Job, Modality, Stage, logs, shot_states, states, variants
from models.db import alone, transaction
from models.job_shots import MIN_SHOTS
from models.recovery import deadline_in, entry_deadline
from models.settings import Settings
from models.shot_list import parse_shot_list, storyboard_instruction
from models.storage import Storage
from tasks import (
    artifacts,
    compensation,
    continuation,
    degrade,
    failures,
    job_models,
    metrics,
    model_swaps,
    outcome,
)
from tasks.batching import Meter, run_batched
from tasks.contract import names
from tasks.contract.prompt_limit import IMAGE_SYSTEM_PROMPT
from tasks.contract.stages import ENTRY_STAGE, is_final, next_stage
from tasks.generators.base import ImageRequest, ImageResult, TextRequest, VideoRequest, VideoResult
from tasks.outcome import Outcome
from tasks.runtime import Runtime, runtime
from tasks.watch import JobWatch

log = logging.getLogger(__name__)

TEXT_DONE_PROGRESS = 20  # a video or image job's progress when its text stage is done


def enter_stage(rt: Runtime, job_id: uuid.UUID, stage: Stage) -> Job | None:
    """Move the job into `stage` (or re-enter it on redelivery); None when there is nothing to do."""
    s_ = rt.settings
    # Past max_stage_attempts the worker died or hung each time: the stage fails below instead.
    deadline = entry_deadline(failures.hard_limit(s_, stage) + s_.stage_grace_s, s_.max_stage_attempts)

    def enter(s: Session) -> Job | None:
        # One UPDATE ... RETURNING does the move, the attempt count and the deadline together.
        # Only the entry stage moves a queued job to running; every later one resumes it.
        job = states.start_text(s, job_id, deadline_at=deadline) if stage == ENTRY_STAGE else None
        if job is None:
            job = states.resume_stage(s, job_id, stage, deadline_at=deadline)
        if job is None:
            current = s.get(Job, job_id)  # only to say why (a redelivery, a stray message)
            if current is None:
                log.warning("job %s not found; dropping %s stage", job_id, stage)
            else:
                where = f"{current.status}/{current.stage}"
                log.info("job %s is %s; %s stage has nothing to do", job_id, where, stage)
            return None
        logs.bind(tenant=job.tenant_id)  # the task's id, job and stage were bound when it started
        return job

    # The entry is one statement, its event in it: committed by itself unless outbox rows must
    # go with it, or nothing moved (models.db.alone; a resume has no event and is always alone).
    job = alone(rt.sessions, enter)
    if job is None:
        return None
    if job.attempts <= s_.max_stage_attempts:
        metrics.stage_entered(job, stage)  # committed: the stage has started
        return job
    # A message that keeps coming back (its worker keeps dying) must not loop forever.
    message = f"{stage} stage gave up after {job.attempts - 1} attempts"
    compensation.fail_and_compensate(rt, job_id, "too_many_attempts", message, stage)
    return None


@shared_task(bind=True, name=names.GENERATE_TEXT)
def generate_text(self: Task[[str], None], job_id: str) -> None:
    """Turn the prompt into text (the final output, the video stage's shot description or the
    image stage's image prompt)."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    with failures.infra_retry(self, rt, jid, Stage.TEXT):
        _text_stage(self, rt, jid)
    # Returning normally: the chain goes on (Celery's continuation, through its template).
    continuation.send_next(self, job_id)


def _text_stage(self: Task[[str], None], rt: Runtime, jid: uuid.UUID) -> None:
    job = enter_stage(rt, jid, Stage.TEXT)
    if job is None:
        return
    p: dict[str, Any] = job.params or {}
    final, then = is_final(job.modality, Stage.TEXT), next_stage(job.modality, Stage.TEXT)
    models = model_swaps.effective(rt.settings)  # the catalog with any hot swap, for this attempt
    meter, model = Meter(), job_models.to_run(job, Stage.TEXT, models)
    spec = job_models.spec(models, Stage.TEXT, model)  # once: a swap from now on is the next attempt's
    started = time.monotonic()
    charge: states.Charge | None = None
    if p.get("enhance_prompt") is False:
        # The client's prompt goes to the next stage as written: no model ran, nothing is charged.
        text, tokens = job.prompt, 0
    else:
        request = TextRequest(
            prompt=job.prompt,
            max_new_tokens=int(p.get("max_new_tokens", rt.settings.default_max_new_tokens)),
            temperature=float(p.get("temperature", 0.0)),
            seed=p.get("seed"),
            repetition_penalty=rt.settings.text_repetition_penalty,
            no_repeat_ngram_size=rt.settings.text_no_repeat_ngram_size,
            system_prompt=_system_prompt(job, then),
        )
        # Per token: a text job's whole bar, or a video or image job's first TEXT_DONE_PROGRESS percent.
        watch = JobWatch(rt, jid, Stage.TEXT, progress_to=99 if final else TEXT_DONE_PROGRESS)
        try:
            result = run_batched(
                self,
                rt.settings,
                Stage.TEXT,
                request,
                should_cancel=watch.canceled,
                on_progress=watch.on_step,
                model=spec,
                meter=meter,
            )
            if result.error is not None:
                raise result.error
        except Exception as exc:
            _charge(rt, jid, Stage.TEXT, _cost(job, Stage.TEXT, meter, model, spec))
            failures.handle(self, rt, job, Stage.TEXT, exc)
        text, tokens = result.text, result.tokens
        charge = _cost(job, Stage.TEXT, meter, model, spec)  # in the same UPDATE: once, with the outcome
    seconds = round(time.monotonic() - started, 3)
    shots: list[str] = []
    if job.modality == Modality.STORYBOARD:  # the answer is a shot list: parsed, repaired or split
        text, shots = shot_plan(job, text)

    def finish(s: Session) -> bool:
        done = states.complete_text(
            s,
            jid,
            text,
            seconds,
            final=final,
            progress=TEXT_DONE_PROGRESS,
            # Now waiting for the next stage's worker.
            deadline_at=None if final else deadline_in(rt.settings.queued_timeout_s),
            tokens=tokens,
            charge=charge,
            next_stage=then or Stage.VIDEO,  # `then` is None only for a final text stage
        )
        if done and shots:
            shot_states.create(s, jid, shots)
        return done

    # A storyboard's shots commit with its text: never alone.
    likely = not shots and states.may_commit_alone(job, finishing=final)
    done = alone(rt.sessions, finish, likely=likely)
    if done:
        metrics.metrics().stage_duration.labels(Stage.TEXT).observe(seconds)


def _system_prompt(job: Job, then: Stage | None) -> str | None:
    """The text model's instructions: the image or storyboard prompt writer's, else the default."""
    if job.modality == Modality.STORYBOARD:
        return storyboard_instruction(int((job.params or {}).get("shots", MIN_SHOTS)))
    return IMAGE_SYSTEM_PROMPT if then == Stage.IMAGE else None


def shot_plan(job: Job, text: str) -> tuple[str, list[str]]:
    """A storyboard's text stage output: (the stored shot list as JSON, its shot descriptions).

    The model's answer as JSON, or repaired, or else split from the text deterministically, so a
    storyboard never fails on its formatting alone; which of the three is recorded.
    """
    count = int((job.params or {}).get("shots", MIN_SHOTS))
    shot_list, how = parse_shot_list(text, count, job.prompt)
    if how != "json":
        log.info("job %s: shot list %s from the text model's answer", job.id, how)
    stored = {"title": shot_list.title, "shots": shot_list.shots, "parsed": how}
    return json.dumps(stored, ensure_ascii=False), list(shot_list.shots)


def _cost(job: Job, stage: Stage, meter: Meter, model: str, spec: str) -> states.Charge:
    """An attempt's charge: its GPU seconds, and the model id (and version) that ran it."""
    return states.Charge(meter.seconds, model, job_models.ran(job, stage, model, spec))


def _charge(rt: Runtime, jid: uuid.UUID, stage: Stage, charge: states.Charge) -> None:
    """Record the GPU time of an attempt that raised, before its failure is handled (retry,
    degrade, fail, cancel): it used the GPU whatever happens next. A successful attempt is
    charged in the transaction that records its result instead."""
    with transaction(rt.sessions) as s:
        states.charge_attempt(s, jid, stage, charge)


@shared_task(bind=True, name=names.GENERATE_VIDEO)
def generate_video(self: Task[[str], None], job_id: str) -> None:
    """Render the shot description to frames and an MP4 (+ thumbnail) under the artifact dir."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    with failures.infra_retry(self, rt, jid, Stage.VIDEO):
        _render_stage(self, rt, jid, Stage.VIDEO)


@shared_task(bind=True, name=names.GENERATE_IMAGE)
def generate_image(self: Task[[str], None], job_id: str) -> None:
    """Render the image prompt to `num_images` PNGs and WebPs (+ thumbnail) in the artifact storage."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    with failures.infra_retry(self, rt, jid, Stage.IMAGE):
        _render_stage(self, rt, jid, Stage.IMAGE)


@dataclass(frozen=True)
class Render:
    """What a render stage does of its own: build its request from the job, write its files.

    `persist(storage, job_id, result)` returns (main file's key, bytes of all files, frames or
    images rendered). Everything else (enter, degrade, batch, charge, fail, complete, settle) is
    the one path in _render_stage.
    """

    request: Callable[[Job, Settings], Any]
    persist: Callable[[Storage, uuid.UUID, Any], tuple[str, int, int]]


def _render_stage(self: Task[[str], None], rt: Runtime, jid: uuid.UUID, stage: Stage) -> None:
    """Enter, generate, persist, finish; what the end means for the files is outcome.settle's call."""
    job = enter_stage(rt, jid, stage)
    if job is None:
        outcome.settle(rt, jid, Outcome.SKIPPED)
        return
    render = RENDERS[stage]
    request = render.request(job, rt.settings)
    models = model_swaps.effective(rt.settings)  # the catalog with any hot swap, for this attempt
    run_request, model = degrade.apply(job, request, models)
    meter, spec = Meter(), job_models.spec(models, stage, model)
    try:
        result, seconds = _render(self, rt, job, stage, run_request, spec, meter)
        relpath, size, count = render.persist(rt.storage, jid, result)
    except Exception as exc:
        _charge(rt, jid, stage, _cost(job, stage, meter, model, spec))
        failures.handle(self, rt, job, stage, exc, render_request=request)
    charge = _cost(job, stage, meter, model, spec)

    def finish(s: Session) -> bool:
        return states.complete_render(s, jid, stage, relpath, size, seconds, count, charge)

    done = alone(rt.sessions, finish, likely=states.may_commit_alone(job, finishing=True))
    if done:
        metrics.metrics().stage_duration.labels(stage).observe(seconds)
    possible = variants.may_have_waiting(job)  # known from the row the stage entered with
    outcome.settle(rt, jid, Outcome.COMPLETED if done else Outcome.OVERTAKEN, variants_possible=possible)


def video_request(job: Job, s_: Settings) -> VideoRequest:
    """The request as the client asked for it (degrade.apply may shrink what actually runs)."""
    p: dict[str, Any] = job.params or {}
    return VideoRequest(
        prompt=job.output_text or job.prompt,
        width=int(p.get("width", s_.default_width)),
        height=int(p.get("height", s_.default_height)),
        num_frames=int(p.get("num_frames", s_.default_num_frames)),
        fps=int(p.get("fps", s_.default_fps)),
        steps=int(p.get("steps", s_.default_steps)),
        seed=p.get("seed"),
    )


def _image_request(job: Job, s_: Settings) -> ImageRequest:
    """The request as the client asked for it (degrade.apply may shrink what actually runs)."""
    p: dict[str, Any] = job.params or {}
    return ImageRequest(
        prompt=job.output_text or job.prompt,
        width=int(p.get("width", s_.default_image_width)),
        height=int(p.get("height", s_.default_image_height)),
        steps=int(p.get("steps", s_.default_steps)),
        seed=p.get("seed"),
        guidance_scale=float(p.get("guidance", s_.default_image_guidance)),
        num_images=int(p.get("num_images", 1)),
    )


def _persist_video(storage: Storage, jid: uuid.UUID, result: VideoResult) -> tuple[str, int, int]:
    relpath, size = artifacts.write_video(storage, jid, result.frames, result.fps)
    return relpath, size, int(result.frames.shape[0])


def _persist_images(storage: Storage, jid: uuid.UUID, result: ImageResult) -> tuple[str, int, int]:
    relpath, size = artifacts.write_images(storage, jid, result.images)
    return relpath, size, int(result.images.shape[0])


RENDERS: dict[Stage, Render] = {
    Stage.VIDEO: Render(video_request, _persist_video),
    Stage.IMAGE: Render(_image_request, _persist_images),
}


def _render(
    self: Task[[str], None],
    rt: Runtime,
    job: Job,
    stage: Stage,
    run_request: VideoRequest | ImageRequest,
    model: str,
    meter: Meter,
) -> tuple[Any, float]:
    """The frames or images (of the degraded request if an earlier attempt recorded a plan) and
    the seconds they took; `meter` gets the GPU share."""
    watch = JobWatch(rt, job.id, stage, progress_from=TEXT_DONE_PROGRESS, progress_to=95)
    started = time.monotonic()
    result = run_batched(
        self, rt.settings, stage, run_request,
        should_cancel=watch.canceled, on_progress=watch.on_step, model=model, meter=meter,
    )  # fmt: skip
    if result.error is not None:
        raise result.error
    return result, round(time.monotonic() - started, 3)


@shared_task(bind=True, name=names.COMPENSATE)
def compensate(self: Task[[str], None], job_id: str) -> None:
    """Errback of the chain (and sent on cancel): fail the job if still active, then compensate.

    Errbacks can fire more than once; compensate_job records and releases only once.
    """
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    with failures.infra_retry(self, rt, jid, None):
        with rt.sessions() as s:
            job = s.get(Job, jid)
            if job is None:
                return
            stage = job.stage
        compensation.fail_and_compensate(rt, jid, "internal_error", "the pipeline failed unexpectedly", stage)
