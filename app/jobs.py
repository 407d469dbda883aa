"""The /v1/jobs endpoints: submit, read, list, cancel and download a job's content."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import uuid
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from flask import Blueprint, Response, jsonify, request, send_from_directory
from pydantic import ValidationError
from sqlalchemy import case, delete, func, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import idempotency, services
from app.admission import admission
from app.auth import current_principal, owned
from app.errors import (
    UNAVAILABLE,
    BadRequest,
    Conflict,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    UnsupportedMediaType,
    ValidationFailed,
)
from app.schemas import ListQuery, complete_params, field_errors, parse_job
from models import Job, JobStatus, states
from models.db import transaction
from models.resource import job_resource
from tasks.names import THUMBNAIL_NAME, stage_task_id
from tasks.publish import publish_compensation, publish_job

log = logging.getLogger("genqueue.api")
bp = Blueprint("jobs", __name__, url_prefix="/v1")

VARIANTS = ("video", "text", "thumbnail")
_RANK = {"high": 0, "normal": 1, "low": 2}


def _job_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFound(f"No job with id {raw!r}.") from None


def _load(session: Session, raw_id: str) -> Job:
    """The caller's job; another tenant's is as absent as a missing one (404, never 403)."""
    job = session.scalar(owned(select(Job).where(Job.id == _job_id(raw_id))))
    if job is None:
        raise NotFound(f"No job with id {raw_id!r}.")
    return job


def queue_positions(session: Session, jobs: list[Job]) -> dict[uuid.UUID, int]:
    """1-based place of each queued job among all queued jobs, in the order workers take them."""
    ids = [j.id for j in jobs if j.status == JobStatus.QUEUED]
    if not ids:
        return {}
    rank = case(_RANK, value=Job.priority, else_=_RANK["normal"])
    pos = func.row_number().over(order_by=(rank, Job.created_at, Job.id))
    ranked = select(Job.id, pos.label("pos")).where(Job.status == JobStatus.QUEUED).subquery()
    rows = session.execute(select(ranked.c.id, ranked.c.pos).where(ranked.c.id.in_(ids)))
    return {row.id: int(row.pos) for row in rows}


def _resource(session: Session, job: Job) -> dict[str, Any]:
    base = services().settings.public_base_url.rstrip("/")
    return job_resource(job, base, queue_positions(session, [job]).get(job.id))


def _body(message: str) -> list[dict[str, str]]:
    return [{"field": "body", "message": message}]


def _json_body() -> Any:
    limit = services().settings.max_body_bytes
    too_large = PayloadTooLarge(
        f"The body must be at most {limit} bytes.", errors=_body(f"over {limit} bytes")
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    mime = request.mimetype
    if mime != "application/json" and not (mime.startswith("application/") and mime.endswith("+json")):
        raise UnsupportedMediaType(
            "The body must be JSON (Content-Type: application/json).",
            errors=_body(f"Content-Type is {mime or 'missing'}"),
        )
    raw = request.get_data(cache=False)  # MAX_CONTENT_LENGTH (limit + 1) bounds chunked bodies
    if len(raw) > limit:
        raise too_large

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(raw, parse_constant=no_constants)
    except ValueError as exc:  # includes invalid UTF-8
        raise BadRequest("The body is not valid JSON.", errors=_body(str(exc))) from None


@bp.post("/jobs")
def submit() -> tuple[Response, int, dict[str, str]]:
    svc = services()
    body = _json_body()
    try:
        req = parse_job(body, svc.settings)
    except ValidationError as exc:
        raise ValidationFailed("The job is invalid.", errors=field_errors(exc, body)) from None
    who = current_principal()
    idem = idempotency.from_request(body, who.tenant_id)
    if idem is not None and (prior := idem.prior(svc.sessions)) is not None:
        return _accepted(prior, replayed=True)
    job_id, params = uuid.uuid4(), complete_params(req, svc.settings)
    gate = admission()
    gate.admit(who, job_id, req.modality, req.prompt, req.priority or "normal", params)  # 403/503/429
    job = Job(
        id=job_id,
        tenant_id=who.tenant_id,
        status=JobStatus.QUEUED,
        modality=req.modality,
        prompt=req.prompt,
        params=params,
        priority=req.priority or "normal",
        meta=req.metadata or {},
        webhook=req.webhook.model_dump(exclude_none=True) if req.webhook else None,
        progress=0,
        attempts=0,
    )
    try:
        with transaction(svc.sessions) as s:  # committed before publishing: a worker must find the row
            s.add(job)
            if idem is not None:
                s.flush()
                idem.claim(s, job.id, svc.settings.idempotency_ttl_s)
    except IntegrityError:
        gate.release(who, job_id)
        # A concurrent request with the same key committed first: answer with its job.
        prior = idem.prior(svc.sessions) if idem is not None else None
        if prior is None:
            raise
        return _accepted(prior, replayed=True)
    except Exception:
        gate.release(who, job_id)
        raise
    try:
        publish_job(svc.celery, job.id, job.modality, job.priority)
    except Exception as exc:
        _discard(job.id)  # nothing may stay queued forever without a message
        gate.release(who, job_id)
        if isinstance(exc, UNAVAILABLE):
            raise ServiceUnavailable("The job queue is unavailable; the job was not accepted.") from exc
        raise
    svc.metrics.jobs_submitted.labels(job.modality).inc()
    try:
        with transaction(svc.sessions) as s:
            states.mark_published(s, job.id)
    except Exception:
        # The message is out, so the job will run: still a success for the client.
        log.exception("job %s published but published_at not recorded", job.id)
    return _accepted(job)


def _accepted(job: Job, replayed: bool = False) -> tuple[Response, int, dict[str, str]]:
    """202 with the job as it is now; a replay of an Idempotency-Key says so in a header."""
    with services().sessions() as s:
        job = s.get(Job, job.id) or job
        resource = _resource(s, job)
    headers = {"Location": f"/v1/jobs/{job.id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return jsonify(resource), 202, headers


def _discard(job_id: uuid.UUID) -> None:
    try:
        with transaction(services().sessions) as s:
            s.execute(delete(Job).where(Job.id == job_id))
    except Exception:
        log.exception("job %s not published and could not be deleted", job_id)


def _conditional(resp: Response) -> Response:
    """A strong ETag over the exact body, so queue_position changes also change it."""
    resp.set_etag(hashlib.sha256(resp.get_data()).hexdigest()[:32])
    return resp.make_conditional(request)


@bp.get("/jobs/<job_id>")
def get_job(job_id: str) -> Response:
    with services().sessions() as s:
        resource = _resource(s, _load(s, job_id))
    return _conditional(jsonify(resource))


def _encode_cursor(job: Job) -> str:
    raw = json.dumps([job.created_at.isoformat(), str(job.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        created, jid = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return datetime.fromisoformat(created), uuid.UUID(jid)
    except (ValueError, TypeError) as exc:
        raise ValidationFailed(errors=[{"field": "cursor", "message": "invalid cursor"}]) from exc


def _statuses(raw: str) -> list[str]:
    values = raw.split(",")  # exactly as documented: no blanks, no spaces
    allowed = [s.value for s in JobStatus]
    if any(v not in allowed for v in values):
        message = f"must be one or more of: {', '.join(allowed)}"
        raise ValidationFailed(errors=[{"field": "status", "message": message}])
    return values


@bp.get("/jobs")
def list_jobs() -> Response:
    try:
        query = ListQuery.model_validate(request.args.to_dict())
    except ValidationError as exc:
        raise ValidationFailed(errors=field_errors(exc, None)) from None
    stmt = owned(select(Job)).order_by(Job.created_at.desc(), Job.id.desc()).limit(query.limit + 1)
    if query.status is not None:
        stmt = stmt.where(Job.status.in_(_statuses(query.status)))
    if query.cursor is not None:
        stmt = stmt.where(tuple_(Job.created_at, Job.id) < tuple_(*_decode_cursor(query.cursor)))
    base = services().settings.public_base_url.rstrip("/")
    with services().sessions() as s:
        jobs = list(s.scalars(stmt))
        page, more = jobs[: query.limit], len(jobs) > query.limit
        positions = queue_positions(s, page)
        data = [job_resource(j, base, positions.get(j.id)) for j in page]
    return jsonify({"data": data, "next_cursor": _encode_cursor(page[-1]) if more else None})


@bp.post("/jobs/<job_id>/cancel")
def cancel_job(job_id: str) -> Response:
    svc = services()
    with transaction(svc.sessions) as s:
        job = _load(s, job_id)  # ownership first: another tenant's job is a 404
        jid = job.id
        canceled = states.cancel(s, jid)
        s.refresh(job)
        if not canceled and job.status != JobStatus.CANCELED:
            raise Conflict(
                f"The job already {job.status}; it cannot be canceled.", extra={"job_status": job.status}
            )
        resource = _resource(s, job)
    if canceled:
        _revoke(str(jid))
        _request_compensation(jid)
    return jsonify(resource)


def _request_compensation(job_id: uuid.UUID) -> None:
    """Best effort: a worker removes the job's files now; otherwise the reaper does, later."""
    try:
        publish_compensation(services().celery, job_id)
    except Exception as exc:
        log.warning("compensation of canceled job %s not queued (the reaper will): %s", job_id, exc)


def _revoke(job_id: str) -> None:
    """Best effort: workers skip these messages; a running stage notices the status itself."""
    ids = [stage_task_id(job_id, stage) for stage in ("text", "video")]
    try:
        services().celery.control.revoke(ids)
    except Exception as exc:
        log.warning("revoke of %s failed (the job is canceled anyway): %s", ids, exc)


@bp.get("/jobs/<job_id>/content")
def content(job_id: str) -> Response:
    svc = services()
    with svc.sessions() as s:
        job = _load(s, job_id)
    variant = request.args.get("variant") or ("video" if job.modality == "video" else "text")
    if variant not in VARIANTS:
        raise ValidationFailed(
            errors=[{"field": "variant", "message": f"must be one of: {', '.join(VARIANTS)}"}]
        )
    if variant == "text":
        if job.output_text is None:
            raise Conflict(
                f"The job is {job.status}; its text is not ready.", extra={"job_status": job.status}
            )
        return _conditional(Response(job.output_text, mimetype="text/plain"))
    if job.modality != "video":
        raise NotFound(f"A {job.modality} job has no {variant}.")
    if job.status != JobStatus.SUCCEEDED or not job.artifact_path:
        raise Conflict(
            f"The job is {job.status}; its {variant} is not ready.", extra={"job_status": job.status}
        )
    path = PurePosixPath(job.artifact_path)
    if variant == "thumbnail":
        return send_from_directory(svc.artifact_dir, str(path.parent / THUMBNAIL_NAME), mimetype="image/jpeg")
    # conditional=True (the default, spelled out): Range -> 206, Accept-Ranges, ETag, 304.
    return send_from_directory(svc.artifact_dir, str(path), mimetype="video/mp4", conditional=True)
