"""The /v1/jobs endpoints: submit, read, list and download (cancel and delete are in app.job_control)."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import uuid
from datetime import datetime
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from flask.blueprints import BlueprintSetupState
from pydantic import ValidationError
from sqlalchemy import select, tuple_
from sqlalchemy.exc import IntegrityError

from app import idempotency, submission
from app.admission import admission
from app.auth import current_principal, owned
from app.body import json_body
from app.body import parse as parse_body
from app.downloads import (
    CONTENT_VARIANTS,
    DEFAULT_VARIANT,
    has_variant,
    image_query,
    object_of,
    send_variant,
    shot_variant,
)
from app.errors import (
    BadRequest,
    Conflict,
    Gone,
    NotFound,
    ValidationFailed,
)
from app.job_access import (
    current_resource,
    load_job,
    models_of,
    queue_counts,
    queue_positions,
    read_job,
    resource_of,
)
from app.metrics import hold_started
from app.prompt_check import PromptCheck
from app.schemas import ListQuery, field_errors
from app.services import extension, services
from app.submit_groups import submit_groups
from app.waiting import Waiters, prefer_wait
from models import Job, JobStatus, logs
from models.base import utcnow
from models.db import read_only_connection
from models.job import TERMINAL
from models.media_links import OUTPUT_VARIANTS, image_count
from models.resource import job_list

log = logging.getLogger("genqueue.api")
bp = Blueprint("jobs", __name__, url_prefix="/v1")

Answer = tuple[Response, int, dict[str, str]]  # body, status, headers


@bp.record_once
def _warm_prompt_check(state: BlueprintSetupState) -> None:
    """Start loading the text model's tokenizer with the app, not on the first submit."""
    settings = state.app.extensions["genqueue"].settings
    state.app.extensions[submission.PROMPT_CHECK] = PromptCheck(settings.text_model)


def _waiters() -> Waiters:
    ext = current_app.extensions
    if "genqueue.waiters" not in ext:
        ext["genqueue.waiters"] = Waiters(services().sessions, services().settings.max_waiters)
    return extension("genqueue.waiters", Waiters)


@bp.post("/jobs")
def submit() -> Answer:
    """O(1): one insert (plus one keyed select for a cacheable request) and one publish."""
    svc = services()
    body = json_body()
    req, errors = submission.validate(body)
    if req is None:
        raise ValidationFailed("The job is invalid.", errors=errors)
    who = current_principal()
    idem = idempotency.from_request(body, who.tenant_id)
    if idem is not None and (prior := idem.prior(svc.sessions)) is not None:
        return _accepted(prior, replayed=True)
    sub = submission.prepare(who, req, utcnow())
    job = sub.job
    logs.bind(job_id=job.id)
    gate = admission()
    gate.admit(who, [job], models=[sub.running])  # 403 (the plan limits the defaults too)/503/429
    if idem is None and sub.cache_key is None and svc.settings.submit_group_max > 1:
        try:  # committed, then published, with the submits in flight beside it (app.submit_groups)
            submit_groups().submit(sub)
        except Exception:
            gate.release(who, [job.id])
            raise
    else:
        try:
            submission.record([sub], idem)
        except IntegrityError:
            gate.release(who, [job.id])
            # A concurrent request with the same key committed first: answer with its job.
            prior = idem.prior(svc.sessions) if idem is not None else None
            if prior is None:
                raise
            return _accepted(prior, replayed=True)
        except Exception:
            gate.release(who, [job.id])
            raise
        submission.publish(who, gate, [job])
    log.info("job accepted: %s, %s%s", job.modality, job.priority, ", from the cache" if job.cached else "")
    wait = prefer_wait(request.headers.get("Prefer"), svc.settings.max_wait_s)
    if wait and job.status not in TERMINAL:
        hold_started()  # the latency histogram measures the submit, not the job
        if _waiters().wait(job.id, wait):
            with svc.sessions() as s:
                job = s.get(Job, job.id) or job
    queue = queue_counts()
    position = queue.position_of_new(job) if job.status == JobStatus.QUEUED and not job.cached else None
    return _answer(job, resource_of(job, position))


def _accepted(job: Job, replayed: bool = False) -> Answer:
    """The job as it is now (an Idempotency-Key replay)."""
    logs.bind(job_id=job.id)
    with services().sessions() as s:
        job = s.get(Job, job.id) or job
        resource = current_resource(s, job)
    return _answer(job, resource, replayed)


def _answer(job: Job, resource: dict[str, Any], replayed: bool = False) -> Answer:
    """A submit's answer: 200 once the job has finished (cache hit, Prefer: wait), else 202."""
    headers = {"Location": f"/v1/jobs/{job.id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return jsonify(resource), 200 if job.status in TERMINAL else 202, headers


def _conditional(resp: Response) -> Response:
    """A strong ETag over the exact body, so queue_position changes also change it."""
    resp.set_etag(hashlib.sha256(resp.get_data()).hexdigest()[:32])
    resp.make_conditional(request)  # in place (it returns resp, typed as werkzeug's Response)
    return resp


@bp.get("/jobs/<job_id:job_id>")
def get_job(job_id: str) -> Response:
    with read_only_connection(services().engine) as conn:
        resource = current_resource(conn, read_job(conn, job_id))
    return _conditional(jsonify(resource))


def _encode_cursor(job: Job) -> str:
    raw = json.dumps([job.created_at.isoformat(), str(job.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        # A forged cursor may hold anything: deep nesting, numbers where strings belong.
        created, jid = parse_body(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)), 1)
        if not isinstance(created, str) or not isinstance(jid, str):
            raise TypeError("cursor fields must be strings")
        return datetime.fromisoformat(created), uuid.UUID(jid)
    except (ValueError, TypeError, BadRequest) as exc:
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
    with services().sessions() as s:
        jobs = list(s.scalars(stmt))
        page, more = jobs[: query.limit], len(jobs) > query.limit
        positions = queue_positions(s, page)
        data = models_of(page, positions)
    return jsonify(job_list(data, _encode_cursor(page[-1]) if more else None))


def _shot(job: Job, index: str) -> Response:
    """A storyboard's shot clip: 404 beyond its shots, 409 until that shot has rendered."""
    if job.modality != "storyboard":
        raise NotFound(f"A {job.modality} job has no shots.")
    found = object_of(job, shot_variant(int(index)))
    if found is None:
        shots = int((job.params or {}).get("shots", 0))
        if int(index) >= shots:
            raise NotFound(f"The storyboard has {shots} shots; there is no shot {int(index)}.")
        raise Conflict(
            f"The job is {job.status}; shot {int(index)} is not ready.", extra={"job_status": job.status}
        )
    if services().storage.stat(found[0]) is None:
        if job.status == JobStatus.RUNNING:
            raise Conflict(f"Shot {int(index)} is not rendered yet.", extra={"job_status": job.status})
        raise NotFound(f"Job {job.id} has no shot {int(index)} (any more).")
    return send_variant(job, shot_variant(int(index)))


@bp.get("/jobs/<job_id>/content")
def content(job_id: str) -> Response:
    svc = services()
    with svc.sessions() as s:
        job = load_job(s, job_id)
    # The query first, whatever the job's state: a malformed request is a 422 even on a deleted job.
    # An empty `?variant=` is invalid like any other value off the list, not the default.
    variant = request.args.get("variant", DEFAULT_VARIANT.get(job.modality, "text"))
    errors = []
    if variant not in CONTENT_VARIANTS:
        errors.append({"field": "variant", "message": f"must be one of: {', '.join(CONTENT_VARIANTS)}"})
    # `index` and `format` choose an image job's file; off the list they are invalid for any variant.
    image_file, image_errors = image_query(request.args.get("index"), request.args.get("format"))
    if errors or image_errors:
        raise ValidationFailed(errors=errors + image_errors)
    if job.data_removed_at is not None:
        raise Gone(f"Job {job_id}'s outputs were removed (expired or deleted).")
    if variant == "text":
        if job.output_text is None:
            raise Conflict(
                f"The job is {job.status}; its text is not ready.", extra={"job_status": job.status}
            )
        return _conditional(Response(job.output_text, mimetype="text/plain"))
    file_variant = image_file if variant == "image" and image_file is not None else variant
    if variant == "shot":
        return _shot(job, request.args.get("index", "0"))
    if not has_variant(job.modality, file_variant):
        raise NotFound(f"{'An' if job.modality == 'image' else 'A'} {job.modality} job has no {variant}.")
    if job.status != JobStatus.SUCCEEDED or not job.artifact_path:
        raise Conflict(
            f"The job is {job.status}; its {variant} is not ready.", extra={"job_status": job.status}
        )
    if variant in OUTPUT_VARIANTS:
        _check_output_variant(job, variant)
    if object_of(job, file_variant) is None:
        raise NotFound(f"The job has {image_count(job.params)} images; there is no {file_variant}.")
    return send_variant(job, file_variant)


def _check_output_variant(job: Job, variant: str) -> None:
    """404 for a variant the job did not ask for or that failed, 409 while it is being made."""
    slot = (job.variants or {}).get(variant)
    if slot is None:
        raise NotFound(f"The job asked for no {variant} variant (params.variants).")
    if slot.get("status") == "failed":
        raise NotFound(f"The job's {variant} variant failed: {slot.get('error')}")
    if slot.get("status") != "ready":
        raise Conflict(
            f"The job's {variant} variant is {slot.get('status')}; try again shortly.",
            extra={"job_status": job.status, "variant_status": slot.get("status")},
        )
