"""Throttled progress reporting and cooperative cancel checks for a running stage."""

from __future__ import annotations

import logging
import time
import uuid

from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from models import Job, JobStatus, Stage, states
from models.base import utcnow
from models.db import transaction
from tasks.runtime import Runtime

log = logging.getLogger(__name__)


class JobWatch:
    """Called from inside generation loops; touches the database at most every interval."""

    def __init__(
        self, rt: Runtime, job_id: uuid.UUID, stage: Stage, progress_from: int = 0, progress_to: int = 99
    ) -> None:
        self.rt, self.job_id, self.stage = rt, job_id, stage
        self.lo, self.hi = progress_from, progress_to
        self.interval = rt.settings.progress_interval_s
        # Both clocks start now: the stage entry just wrote the job (running, at progress_from),
        # so a write or a cancel check in the stage's first interval would learn nothing new.
        # A stage quicker than one interval touches the database only to finish.
        self._last_progress = self._last_check = time.monotonic()
        # job.progress events (webhooks) are rarer than progress writes; starting the clock at
        # stage entry keeps them apart across stages and redeliveries too.
        self._last_event = utcnow()
        self._canceled = False

    def on_step(self, step: int, total: int) -> None:
        """The stage's progress callback (batching's ProgressCallback): step of total done."""
        now = time.monotonic()
        if now - self._last_progress < self.interval:
            return  # the last step too: the stage's completion follows it and sets progress itself
        self._last_progress = now
        progress = self.lo + (self.hi - self.lo) * step // max(total, 1)
        at = utcnow()
        due = (at - self._last_event).total_seconds() >= self.rt.settings.webhook_progress_interval_s
        try:
            with transaction(self.rt.sessions) as s:
                event_at = at if due else None
                moved = states.set_progress(s, self.job_id, self.stage, progress, event_at=event_at)
        except OperationalError as exc:  # progress is advisory: a database blip must not kill the stage
            log.warning("job %s progress not recorded: %s", self.job_id, type(exc).__name__)
            return
        if moved and due:
            self._last_event = at

    def canceled(self) -> bool:
        """True once the job left the running state (canceled by the client, or failed)."""
        now = time.monotonic()
        if self._canceled or now - self._last_check < self.interval:
            return self._canceled
        self._last_check = now
        try:
            with self.rt.sessions() as s:
                status = s.execute(select(Job.status).where(Job.id == self.job_id)).scalar()
        except OperationalError:  # unknown: keep going; the final transition is conditional anyway
            return False
        self._canceled = status != JobStatus.RUNNING
        return self._canceled
