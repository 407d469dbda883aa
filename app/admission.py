"""Admission of a new job: the tenant's plan (403), the system's backlog (503), the tenant's quota (429).

The backlog is measured in Postgres (one grouped count over the active jobs, through the
status index) at most once per `admission_cache_s` per process, so the submit path stays
fast however many requests arrive. Per stage:
  text:  jobs still queued (every job starts with the text stage);
  video: video jobs not finished yet (each still needs the video stage);
  image: image jobs not finished yet (each still needs the image stage).
With `admission_max_wait_s` set, the estimated wait is the active jobs divided by the rate
jobs finished over the last minute; with nothing finished yet there is no estimate, and only
the backlog bounds apply.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from flask import Flask
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.errors import Overloaded, PlanLimitExceeded, QuotaExceeded, Reason
from app.quota import ActiveJobs
from app.services import extension
from models import Job, JobStatus
from models.base import utcnow
from models.job import ACTIVE
from models.keys import Principal
from models.plans import Plan
from models.settings import Settings

THROUGHPUT_WINDOW_S = 60
RETRY_MIN_S, RETRY_MAX_S, RETRY_UNKNOWN_S = 1, 300, 30
QUOTA_RETRY_S = 5


VIDEO_QUEUE_MODALITIES = ("video", "storyboard")  # the jobs that wait for the video queue

BACKLOG_REASONS: dict[str, Reason] = {
    "text": "text_backlog",
    "video": "video_backlog",
    "image": "image_backlog",
}


@dataclass(frozen=True)
class Backlog:
    text: int
    video: int
    active: int
    finished_per_s: float | None  # None: not measured (no wait bound configured)
    image: int = 0

    def wait_s(self) -> float | None:
        if not self.finished_per_s:
            return None
        return self.active / self.finished_per_s


class Admission:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session]) -> None:
        self.settings = settings
        self.sessions = sessions
        self.quota = ActiveJobs(settings.ratelimit_storage_uri, sessions)
        self._lock = threading.Lock()
        self._cached: tuple[float, Backlog] | None = None

    # -- backlog ---------------------------------------------------------------------------

    def backlog(self) -> Backlog:
        """The last measurement if fresh enough; one thread re-measures while others reuse it."""
        cached = self._cached
        if cached and time.monotonic() - cached[0] < self.settings.admission_cache_s:
            return cached[1]
        with self._lock:
            cached = self._cached
            if cached and time.monotonic() - cached[0] < self.settings.admission_cache_s:
                return cached[1]
            backlog = self._measure()
            self._cached = (time.monotonic(), backlog)
            return backlog

    def _measure(self) -> Backlog:
        counts = select(Job.modality, Job.status, func.count()).where(Job.status.in_(ACTIVE))
        with self.sessions() as s:
            rows: Any = s.execute(counts.group_by(Job.modality, Job.status)).all()
            rate = None
            if self.settings.admission_max_wait_s > 0:
                since = utcnow() - timedelta(seconds=THROUGHPUT_WINDOW_S)
                done = s.scalar(select(func.count()).where(Job.completed_at >= since)) or 0
                rate = done / THROUGHPUT_WINDOW_S
        return Backlog(
            text=sum(n for _, st, n in rows if st == JobStatus.QUEUED),
            video=sum(n for mod, _, n in rows if mod in VIDEO_QUEUE_MODALITIES),
            image=sum(n for mod, _, n in rows if mod == "image"),
            active=sum(n for _, _, n in rows),
            finished_per_s=rate,
        )

    def _retry_after(self, excess: int, backlog: Backlog) -> int:
        if not backlog.finished_per_s:
            return RETRY_UNKNOWN_S
        return min(RETRY_MAX_S, max(RETRY_MIN_S, math.ceil(excess / backlog.finished_per_s)))

    def check_backlog(self, jobs: int = 1, video: int = 0, image: int = 0) -> None:
        """503 unless `jobs` more jobs, `video` of them video and `image` image jobs, fit under the bounds."""
        s, b = self.settings, self.backlog()
        # Every job starts with the text stage; video and image jobs also wait for their render stage.
        bounds = [
            ("text", b.text, s.admission_max_text_backlog, jobs),
            ("video", b.video, s.admission_max_video_backlog, video),
            ("image", b.image, s.admission_max_image_backlog, image),
        ]
        for stage, size, bound, more in bounds:
            if more and size + more > bound:
                raise Overloaded(
                    f"The {stage} stage is overloaded ({size} jobs waiting); retry later.",
                    retry_after=self._retry_after(size + more - bound, b),
                    extra={"stage": stage},
                    reason=BACKLOG_REASONS[stage],
                )
        wait = b.wait_s()
        if wait is not None and b.finished_per_s:
            wait += (jobs - 1) / b.finished_per_s  # the batch's last job waits for its first ones
        if s.admission_max_wait_s > 0 and wait is not None and wait > s.admission_max_wait_s:
            raise Overloaded(
                f"The estimated wait ({wait:.0f} s) is over {s.admission_max_wait_s:.0f} s; retry later.",
                retry_after=min(RETRY_MAX_S, max(RETRY_MIN_S, math.ceil(wait - s.admission_max_wait_s))),
                reason="estimated_wait",
            )

    # -- the whole gate ----------------------------------------------------------------------

    def admit(
        self,
        who: Principal,
        jobs: Sequence[Job],
        batch: bool = False,
        models: Sequence[Mapping[str, str] | None] | None = None,
    ) -> None:
        """Raise the error the client gets, or reserve a quota slot for each job (see release).

        Every job counts: a batch of n takes n of the backlog bounds and n quota slots, all or
        none. `models`: per job, stage -> the model id it runs (complete, defaults included), which
        the plan's allowed_models limits. `batch`: the fields of plan violations are named
        `jobs[i].<field>`.
        """
        plan = Plan.effective(self.settings, who.plan_overrides)
        errors, limits = [], {}
        for i, job in enumerate(jobs):
            running = models[i] if models is not None else None
            for v in plan.violations(job.prompt, job.priority, job.params, running):
                errors.append({"field": f"jobs[{i}].{v.field}" if batch else v.field, "message": v.message})
                limits[v.limit] = v.allowed
        if errors:
            raise PlanLimitExceeded(
                f"The job goes beyond your plan's limits: {', '.join(limits)}.",
                errors=errors,
                extra={"limits": limits},
            )
        self.check_backlog(
            len(jobs),
            video=sum(1 for j in jobs if j.modality in VIDEO_QUEUE_MODALITIES),
            image=sum(1 for j in jobs if j.modality == "image"),
        )
        ids = [j.id for j in jobs]
        admitted, active = self.quota.reserve(who.tenant_id, ids, plan.max_active_jobs)
        if not admitted:
            more = f" This batch needs {len(ids)} more." if batch else ""
            raise QuotaExceeded(
                f"Your tenant has {active} queued or running jobs; its plan allows "
                f"{plan.max_active_jobs}.{more} Retry when some finish.",
                retry_after=QUOTA_RETRY_S,
                extra={"limits": {"max_active_jobs": plan.max_active_jobs}},
            )

    def release(self, who: Principal, job_ids: list[uuid.UUID]) -> None:
        self.quota.release(who.tenant_id, job_ids)


EXTENSION = "genqueue.admission"


def init_app(app: Flask, settings: Settings, sessions: sessionmaker[Session]) -> None:
    app.extensions[EXTENSION] = Admission(settings, sessions)


def admission() -> Admission:
    return extension(EXTENSION, Admission)
