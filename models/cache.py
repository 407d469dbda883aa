"""Result cache and in-flight coalescing: identical seeded requests reuse one computation.

A job that computes stores a `cache_key` (prompt with whitespace collapsed, complete params, the
model specs and their versions, a configured cache version). A later identical request either
copies a finished source job's outputs (done in the same transaction, `cached: true`) or, while
the source is still queued or running, becomes its follower: it holds no broker message and is
finished, failed or re-published together with its source (see settle_followers/promote_follower).
Versions come from installed package metadata and local model folders, so this needs no torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import uuid
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from sqlalchemy import ColumnElement, and_, case, select, text, update
from sqlalchemy.orm import Session

from models import catalog, outbox
from models.base import utcnow
from models.job import ACTIVE, Job, JobStatus, Modality
from models.settings import Settings
from models.storage import Storage

# Params that choose only what is made from the job's MP4, not the MP4 (models.variants): outside
# the result cache key, so a job asking for variants still reuses an identical job's video.
VARIANT_PARAMS = ("variants", "upscale_factor")


@lru_cache(maxsize=64)
def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "-"


@lru_cache(maxsize=64)
def spec_version(spec: str) -> str:
    """A version string for a configured model: package version, or a local folder's manifest stamp."""
    package = catalog.version_package(spec)  # a built-in: the package that pins its weights or code
    if package is not None:
        return _dist_version(package)
    for manifest in ("model_index.json", "config.json"):
        path = os.path.join(spec, manifest)
        if os.path.isfile(path):
            st = os.stat(path)
            return f"{st.st_size}-{st.st_mtime_ns}"
    if ":" in spec and not os.path.exists(spec):  # an adapter class: its name is all there is to go by
        return "adapter-" + hashlib.sha256(spec.encode()).hexdigest()[:12]
    return "-"


def model_versions(settings: Settings, modality: str, models: Mapping[str, str | None] | None = None) -> str:
    """Everything about the models a job of this modality runs through that can change its output.

    `models`: stage -> the model id the job runs there (models.catalog; None: the default), for
    every stage of its pipeline; omitted, the configured models of its pipeline (text, and video
    or image).
    """
    if models is None:
        render = {Modality.VIDEO: "video", Modality.IMAGE: "image"}.get(Modality(modality))
        models = {"text": None} | ({render: None} if render else {})
    parts = []
    for stage in sorted(models):
        spec = catalog.spec_of(settings, stage, models[stage])
        part = f"{spec}@{spec_version(spec)}"
        if stage == "text":
            # The dtype setting too: bf16 and float32 weights give slightly different texts.
            # And the decoding settings: a different repetition penalty gives a different text.
            decoding = f"rp{settings.text_repetition_penalty}/nr{settings.text_no_repeat_ngram_size}"
            part += f"/{settings.text_dtype}/{decoding}"
        parts.append(f"{stage}={part}")
    libs = sorted({lib for stage in models for lib in catalog.LIBRARIES.get(stage, ())})
    parts += [f"{lib}={_dist_version(lib)}" for lib in libs]
    parts.append(f"cache={settings.cache_version}")
    return ";".join(parts)


def normalise_prompt(prompt: str) -> str:
    return " ".join(prompt.split())


def cache_key(
    settings: Settings,
    modality: str,
    prompt: str,
    params: dict[str, Any],
    models: Mapping[str, str | None] | None = None,
) -> str:
    """sha256 over the normalised prompt, the complete params and the models (stage -> id) with
    their versions: the same model under two ids shares results, a new version does not."""
    payload = json.dumps(
        {
            "modality": str(modality),
            "prompt": normalise_prompt(prompt),
            # Variants are made per job from its own MP4: they do not change the result reused.
            "params": {k: v for k, v in params.items() if k not in VARIANT_PARAMS},
            "models": model_versions(settings, modality, models),
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _lock_key(session: Session, key: str) -> None:
    """Serialise lookups of one key (Postgres) so simultaneous identical submits coalesce too."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": int(key[:15], 16)})


def lock_keys(session: Session, keys: list[str]) -> None:
    """Take the locks of several keys at once, in one order (a batch submit): two batches sharing
    keys then never hold one each while waiting for the other's. find_source takes them again
    (Postgres advisory locks stack within a transaction)."""
    for key in sorted(set(keys)):
        _lock_key(session, key)


def find_source(
    session: Session,
    key: str,
    storage: Storage | None = None,
    tenant_id: uuid.UUID | None = None,
) -> Job | None:
    """The job to reuse for `key`: the newest succeeded one, else an active one; None on a miss.

    Only the tenant's own jobs are reused, so no tenant learns what another asked for.
    Call inside the submit transaction; on Postgres it holds the key's lock until commit.
    """
    _lock_key(session, key)
    # A job whose data was removed (models.retention) has no key any more; checked anyway.
    usable: ColumnElement[bool] = and_(
        Job.status.in_([JobStatus.SUCCEEDED, *ACTIVE]), Job.data_removed_at.is_(None)
    )
    if tenant_id is not None:
        usable = and_(usable, Job.tenant_id == tenant_id)
    done_first = case((Job.status == JobStatus.SUCCEEDED, 0), else_=1)
    stmt = (
        select(Job).where(Job.cache_key == key, usable).order_by(done_first, Job.created_at.desc()).limit(2)
    )
    for job in session.scalars(stmt):
        if (
            job.status == JobStatus.SUCCEEDED
            and job.modality in (Modality.VIDEO, Modality.IMAGE)
            and not _present(job, storage)
        ):
            continue  # artifacts expire or get removed: a result whose object is gone is not a hit
        return job
    return None


def _present(job: Job, storage: Storage | None) -> bool:
    """The source's main object (its video, its first PNG) still exists (one stat: a HEAD on S3)."""
    if not job.artifact_path:
        return False
    return storage is None or storage.exists(job.artifact_path)


def attach(session: Session, job: Job, source: Job) -> None:
    """Add `job` as a cached copy of a finished source, or as a follower of an active one."""
    now = utcnow()
    job.cached, job.source_job_id, job.cache_key = True, source.id, None
    job.published_at = now  # no message of its own, and none is owed: nothing to republish
    if source.status != JobStatus.SUCCEEDED:
        session.add(job)
        return
    job.status, job.stage, job.progress = JobStatus.SUCCEEDED, source.stage, 100
    job.output_text, job.artifact_path, job.artifact_bytes = (
        source.output_text,
        source.artifact_path,
        source.artifact_bytes,
    )
    job.models = source.models or job.models  # what ran for the source ran for this copy
    job.started_at = job.text_completed_at = job.completed_at = now
    session.add(job)
    session.flush()  # the job row before its event row
    ev = {
        "job_id": job.id,
        "type": "job.succeeded",
        "from_status": JobStatus.QUEUED,
        "to_status": JobStatus.SUCCEEDED,
        "stage": source.stage,
        "data": {"cached": True, "source_job_id": str(source.id)},
        "created_at": now,
    }
    outbox.add_events(session, job, [ev])  # its webhook fires like any finished job's


def settle_followers(session: Session, source_id: uuid.UUID) -> int:
    """After the source finished: finish its active followers the same way. Returns how many."""
    source = session.execute(
        select(
            Job.status, Job.stage, Job.cache_key, Job.output_text, Job.artifact_path, Job.artifact_bytes,
            Job.error_code, Job.error_message, Job.error_stage, Job.models,
        ).where(Job.id == source_id)
    ).one_or_none()  # fmt: skip
    if source is None or source.cache_key is None:
        return 0  # only jobs with a key can have followers
    if source.status not in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        return 0
    ids = session.scalars(select(Job.id).where(Job.source_job_id == source_id, Job.status.in_(ACTIVE))).all()
    now = utcnow()
    if source.status == JobStatus.SUCCEEDED:
        values: dict[str, Any] = {
            "status": JobStatus.SUCCEEDED, "stage": source.stage, "progress": 100,
            "output_text": source.output_text, "artifact_path": source.artifact_path,
            "artifact_bytes": source.artifact_bytes, "started_at": now, "text_completed_at": now,
            "models": source.models,
        }  # fmt: skip
        event, data = "job.succeeded", {"cached": True, "source_job_id": str(source_id)}
    else:
        values = {
            "status": JobStatus.FAILED,
            "error_code": source.error_code,
            "error_message": f"the identical job {source_id} failed: {source.error_message}"[:2000],
            "error_stage": source.error_stage,
        }
        event, data = "job.failed", {"code": source.error_code, "stage": source.error_stage}
    settled = 0
    for fid in ids:
        stmt = (
            update(Job)
            .where(Job.id == fid, Job.status.in_(ACTIVE))
            .values(updated_at=now, completed_at=now, **values)
            .execution_options(synchronize_session=False)
        )
        # RETURNING the row gives the webhook outbox its snapshot (as in states._transition).
        row = session.execute(stmt.returning(Job).execution_options(populate_existing=True)).scalar()
        if row is not None:
            ev = {
                "job_id": fid, "type": event, "from_status": JobStatus.QUEUED, "to_status": values["status"],
                "stage": values.get("stage") or values.get("error_stage"), "data": data, "created_at": now,
            }  # fmt: skip
            outbox.add_events(session, row, [ev])
            settled += 1
    return settled


def promote_follower(session: Session, source_id: uuid.UUID) -> Job | None:
    """The source was canceled: its oldest active follower computes instead (the caller publishes it).

    The other followers follow the promoted job. None when there was no follower.
    """
    key = session.scalar(select(Job.cache_key).where(Job.id == source_id))
    heir = session.scalars(
        select(Job)
        .where(Job.source_job_id == source_id, Job.status == JobStatus.QUEUED)
        .order_by(Job.created_at, Job.id)
        .limit(1)
    ).first()
    if heir is None:
        return None
    heir.cached, heir.source_job_id, heir.cache_key, heir.published_at = False, None, key, None
    session.flush()
    session.execute(
        update(Job)
        .where(Job.source_job_id == source_id, Job.status.in_(ACTIVE))
        .values(source_job_id=heir.id, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    return heir
