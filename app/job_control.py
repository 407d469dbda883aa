"""Cancel and delete a job: the state change, then revoke, compensate, hand the work to an identical job."""

from __future__ import annotations

import logging
import uuid

from flask import Blueprint, Response, jsonify
from sqlalchemy.orm import Session

from app.errors import Conflict
from app.job_access import current_resource, load_job, published_marks
from app.services import services
from models import Job, JobStatus, Modality, cache, retention, states
from models.db import transaction
from models.job_shots import MAX_SHOTS
from tasks.contract.names import job_prefix, shot_task_id, stage_task_id
from tasks.contract.publish import publish_compensation, publish_job
from tasks.contract.stages import PIPELINES

log = logging.getLogger("genqueue.api")
bp = Blueprint("job_control", __name__, url_prefix="/v1")


@bp.post("/jobs/<job_id>/cancel")
def cancel_job(job_id: str) -> Response:
    with transaction(services().sessions) as s:
        job = load_job(s, job_id)  # ownership first: another tenant's job is a 404
        jid, modality = job.id, job.modality
        canceled, heir = _cancel(s, job)
        if not canceled and job.status != JobStatus.CANCELED:
            raise Conflict(
                f"The job already {job.status}; it cannot be canceled.", extra={"job_status": job.status}
            )
        resource = current_resource(s, job)
    _after_cancel(jid, modality, canceled, heir)
    return jsonify(resource)


@bp.delete("/jobs/<job_id:job_id>")
def delete_job(job_id: str) -> Response:
    """Cancel if active, remove the outputs, prompt and stored files; the row stays (204, idempotent)."""
    svc = services()
    with transaction(svc.sessions) as s:
        job = load_job(s, job_id)  # another tenant's job is a 404, like a missing one
        jid, modality = job.id, job.modality
        canceled, heir = _cancel(s, job)
        retention.mark_removed(s, [jid])  # a no-op the second time: DELETE is idempotent
    _after_cancel(jid, modality, canceled, heir)
    # Marked first, so nothing serves or reuses the files while they go; a video or image stage
    # still writing when canceled leaves files its compensation removes.
    svc.storage.delete_prefix(job_prefix(jid))
    return Response(status=204)


def _cancel(s: Session, job: Job) -> tuple[bool, Job | None]:
    """Cancel the job if still active; (whether this call did, the follower computing instead)."""
    canceled = states.cancel(s, job.id)
    s.refresh(job)
    # Identical jobs waiting on this one must not lose their computation with it.
    heir = cache.promote_follower(s, job.id) if canceled else None
    return canceled, heir


def _after_cancel(jid: uuid.UUID, modality: str, canceled: bool, heir: Job | None) -> None:
    """After the cancel committed: stop its messages, compensate, publish the heir."""
    if canceled:
        _revoke(str(jid), modality)
        _request_compensation(jid)
    if heir is not None:
        try:
            publish_job(services().celery, heir.id, heir.modality, heir.priority)
            published_marks().add(heir.id)  # recorded like a submit's
        except Exception:  # the heir stays queued with no published_at: the reaper republishes it
            log.exception("follower %s of canceled job %s could not be published", heir.id, jid)


def _request_compensation(job_id: uuid.UUID) -> None:
    """Best effort: a worker removes the job's files now; otherwise the reaper does, later."""
    try:
        publish_compensation(services().celery, job_id)
    except Exception as exc:
        log.warning("compensation of canceled job %s not queued (the reaper will): %s", job_id, exc)


def _revoke(job_id: str, modality: str) -> None:
    """Best effort: workers skip these messages; a running stage notices the status itself."""
    ids = [stage_task_id(job_id, stage) for stage in PIPELINES[Modality(modality)]]
    if modality == Modality.STORYBOARD:  # its queued shots: every index it may have (a few ids)
        ids += [shot_task_id(job_id, index) for index in range(MAX_SHOTS)]
    try:
        services().celery.control.revoke(ids)
    except Exception as exc:
        log.warning("revoke of %s failed (the job is canceled anyway): %s", ids, exc)
