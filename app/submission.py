"""Submitting jobs: the steps POST /v1/jobs and POST /v1/jobs/batch share, each on a list of jobs.

A single submit is a batch of one through the same steps, so a job behaves the same whichever
way it came (params, cache, priorities, webhooks, quota). The expensive steps take the whole
list at once: one quota round trip to Redis, one transaction with one multi-row INSERT, one
broker connection and producer for every message.

The steps, in order: `validate` (one item: its fields, its prompt's tokens, its models), `prepare`
(one item: the job row, its completed params, its models, its cache key), then on the whole list
the admission gate (app.admission: plan, backlog, quota), `record` (commit) and `publish`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from flask import current_app, g
from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.admission import Admission
from app.errors import ServiceUnavailable, ValidationFailed
from app.idempotency import Idempotency
from app.job_access import published_marks, queue_counts
from app.model_choice import choose as choose_models
from app.model_choice import resolved as resolved_models
from app.models_api import model_swaps
from app.prompt_check import PromptCheck
from app.schemas import AnyJobCreate, complete_params, field_errors, parse_job
from app.services import extension, services
from models import Job, JobStatus, cache, job_writes, states, variants
from models import catalog as model_catalog
from models.db import autocommit, transaction
from models.job import TERMINAL
from models.keys import Principal
from models.settings import Settings
from tasks.contract.publish import publish_jobs, publish_postprocess
from tasks.contract.transient import is_transient

log = logging.getLogger("genqueue.api")
Request = AnyJobCreate
FieldErrors = list[dict[str, str]]
PROMPT_CHECK = "genqueue.prompt_check"
CATALOG = "genqueue_catalog"  # on flask.g
DEFAULTS = "genqueue_default_models"  # on flask.g


def prompt_check() -> PromptCheck:
    ext = current_app.extensions
    if PROMPT_CHECK not in ext:
        ext[PROMPT_CHECK] = PromptCheck(services().settings.text_model)
    return extension(PROMPT_CHECK, PromptCheck)


def _field(at: str, field: str) -> str:
    """`field` inside the item at `at` (e.g. jobs[3].params.width); "body" is the item itself."""
    if not at:
        return field
    return at if field == "body" else f"{at}.{field}"


def catalog() -> Settings:
    """The settings with the hot swaps in effect: the models a new job may name and will run.

    Read once per request: every item of a batch, in validate and in prepare, sees the same swaps.
    """
    if CATALOG not in g:
        setattr(g, CATALOG, model_swaps().effective(services().settings))
    return cast(Settings, getattr(g, CATALOG))


def default_models() -> dict[str, str]:
    """stage -> the catalog's default model id, worked out once per request, not per job and stage
    (looking each one up was about 7% of a 500-job batch's web samples)."""
    if DEFAULTS not in g:
        setattr(g, DEFAULTS, {stage: m.id for stage, m in model_catalog.defaults(catalog()).items()})
    return cast("dict[str, str]", getattr(g, DEFAULTS))


def validate(body: Any, at: str = "") -> tuple[Request | None, FieldErrors]:
    """The job request in `body`, or the errors naming its fields (inside `at`, for a batch item)."""
    try:
        req = parse_job(body, services().settings)
    except ValidationError as exc:
        return None, [{**e, "field": _field(at, e["field"])} for e in field_errors(exc, body)]
    if (too_long := prompt_check().error(req.prompt)) is not None:  # the worker would refuse it
        return None, [{"field": _field(at, "prompt"), "message": too_long}]
    try:
        choose_models(catalog(), req.modality, req.model)  # an unknown model or stage
    except ValidationFailed as exc:
        return None, [{**e, "field": _field(at, e["field"])} for e in exc.errors or []]
    return req, []


@dataclass
class Submission:
    job: Job  # transient (job_writes.new_job): written by one Core INSERT
    cache_key: str | None  # set when the result cache is looked up for it
    running: dict[str, str]  # stage -> the model id it runs, defaults included (plan allowed_models)


def prepare(who: Principal, req: Request, now: datetime) -> Submission:
    """The job row a request becomes: a new id, params completed (a seed drawn if omitted), the
    models it named per stage (validate checked them), its cache key over those models' versions."""
    settings, models_in = services().settings, catalog()
    params = complete_params(req, settings)
    models = choose_models(models_in, req.modality, req.model)
    job = job_writes.new_job(
        id=uuid.uuid4(),
        tenant_id=who.tenant_id,
        status=JobStatus.QUEUED,
        modality=req.modality,
        prompt=req.prompt,
        params=params,
        models={stage: {"asked": model_id} for stage, model_id in models.items()},
        priority=req.priority or "normal",
        meta=req.metadata or {},
        webhook=req.webhook.model_dump(exclude_none=True) if req.webhook else None,
        variants=variants.slots(params),
        progress=0,
        attempts=0,
        recoveries=0,
        cached=False,
        created_at=now,
        updated_at=now,
    )
    seeded = req.params is not None and req.params.seed is not None  # the same seed, the same output
    cacheable = settings.cache_enabled and req.cache is not False and seeded
    # The key covers the versions that will run: the catalog with the hot swaps in effect.
    key = cache.cache_key(models_in, job.modality, job.prompt, params, models) if cacheable else None
    if key is not None and req.modality == "storyboard":
        # A storyboard is not reused whole (its shot list and files are its own): its key only
        # lets its shots reuse identical shots, one by one (models.shot_cache).
        job.cache_key, key = key, None
    return Submission(job, key, resolved_models(default_models(), models))


def record(subs: Sequence[Submission], idem: Idempotency | None, batch: bool = False) -> None:
    """Commit the jobs (and the Idempotency-Key) before anything is published: a worker must find them.

    A lone INSERT commits by itself (one round trip); anything more is one transaction. Raises
    IntegrityError when a concurrent request with the same key committed first.
    """
    svc = services()
    plain = [sub.job for sub in subs if sub.cache_key is None]
    keyed = [sub for sub in subs if sub.cache_key is not None]
    unit = transaction if keyed or idem is not None or len(subs) > 1 else autocommit
    with unit(svc.sessions) as s:
        queue_counts().totals(s)  # refreshed at most once per TTL, before these jobs are counted
        if len(plain) == 1:
            job_writes.insert_new(s, plain[0])
        elif plain:
            job_writes.insert_many(s, plain)
        if keyed:
            cache.lock_keys(s, [sub.cache_key for sub in keyed if sub.cache_key])
        for sub in keyed:
            _insert_cacheable(s, sub)
        if idem is not None:
            s.flush()  # the job rows before the key row that points at them
            idem.claim(s, [sub.job.id for sub in subs], svc.settings.idempotency_ttl_s, batch)


def _insert_cacheable(s: Session, sub: Submission) -> None:
    """Add the job, as a cached copy or follower of an identical one when there is one."""
    assert sub.cache_key is not None
    svc = services()
    source = cache.find_source(s, sub.cache_key, svc.storage, sub.job.tenant_id)
    if source is None:
        sub.job.cache_key = sub.cache_key
        job_writes.insert_new(s, sub.job)
    else:
        cache.attach(s, sub.job, source)


def publish(who: Principal, gate: Admission, jobs: Sequence[Job]) -> None:
    """Publish every computing job over one producer; a cache hit gives its quota slot back.

    If the broker fails before any message is known to be out (publish_jobs: on Redis all go in
    one pipeline), every job is withdrawn and this raises (503 for a broker outage): nothing was
    accepted. Once some are out the rest stay committed and unpublished, which the reaper
    publishes after publish_grace_s, as it does for a submit whose process died between its
    commit and its publish: the batch was accepted as a whole.
    """
    svc = services()
    for job in jobs:
        if job.cached:
            kind = "result" if job.status in TERMINAL else "follower"
            svc.metrics.cache_hits.labels(job.modality, kind).inc()
    finished = [job.id for job in jobs if job.cached and job.status in TERMINAL]
    if finished:
        gate.release(who, finished)  # answered from the cache: they hold no slot
    for job in jobs:
        if job.cached and job.status == JobStatus.SUCCEEDED and job.variants:
            publish_postprocess(svc.celery, job.id)  # a cached copy's variants are made from its video
    computing = [job for job in jobs if not job.cached]
    if not computing:
        return
    try:
        send(computing, withdraw=jobs)
    except Exception:
        gate.release(who, [job.id for job in jobs])
        raise


def send(computing: Sequence[Job], withdraw: Sequence[Job] | None = None) -> None:
    """Publish the committed `computing` jobs' messages over one producer, the tenants' quota aside.

    If the broker fails before any message is known to be out, the jobs (`withdraw`: all that were
    committed with them) are deleted and this raises (503 for a broker outage); once some are out,
    the rest stay for the reaper.
    """
    svc = services()
    marks, sent = published_marks(), []

    def published(job_ids: list[uuid.UUID]) -> None:
        sent.extend(job_ids)
        for job_id in job_ids:
            marks.add(job_id)  # recorded within ~50 ms, in one UPDATE with its neighbours

    try:
        publish_jobs(svc.celery, [(j.id, j.modality, j.priority) for j in computing], published)
    except Exception as exc:
        if sent:
            log.warning(
                "%d of %d jobs not published (%s); the reaper publishes them",
                len(computing) - len(sent), len(computing), type(exc).__name__,
            )  # fmt: skip
        else:
            _withdraw([job.id for job in (computing if withdraw is None else withdraw)])
            if is_transient(exc):
                raise ServiceUnavailable(
                    "The job queue is unavailable; the job was not accepted.", reason="broker"
                ) from exc
            raise
    counted = {job.id: job for job in computing}
    for job_id in sent:
        svc.metrics.jobs_submitted.labels(counted[job_id].modality).inc()
    queue = queue_counts()
    for job in computing:
        queue.submitted(job.priority)


def _withdraw(job_ids: list[uuid.UUID]) -> None:
    try:
        with transaction(services().sessions) as s:
            for job_id in job_ids:
                states.withdraw(s, job_id)
    except Exception:
        log.exception("%d jobs not published and could not be deleted", len(job_ids))
