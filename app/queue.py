"""Approximate queue positions from index-only counts, with per-process caching of the totals."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.orm import Session, aliased

from models import Job, JobStatus

RANK = {"high": 0, "normal": 1, "low": 2}  # the order workers take them (broker priorities)


class QueueCounts:
    """Queued jobs per priority, re-counted at most every `ttl_s` seconds per process.

    A position is (queued jobs of higher priority, from these totals) + (queued jobs of the
    same priority created earlier, counted per request on ix_jobs_status_priority_created) + 1.
    Between re-counts, submits through this process bump the totals, so they stay close.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._at = -float("inf")
        self._older: Select[uuid.UUID, int] | None = None

    def _older_stmt(self) -> Select[uuid.UUID, int]:
        """Built once: an aliased self-join costs more Python to construct than to run."""
        if self._older is None:
            ahead = aliased(Job)
            same_older = (
                select(func.count())
                .where(
                    ahead.status == JobStatus.QUEUED,
                    ahead.priority == Job.priority,
                    ahead.created_at < Job.created_at,
                )
                .correlate(Job)
                .scalar_subquery()
            )
            self._older = select(Job.id, same_older).where(Job.id.in_(bindparam("ids", expanding=True)))
        return self._older

    def totals(self, session: Session) -> dict[str, int]:
        with self._lock:
            if time.monotonic() - self._at < self.ttl_s:
                return dict(self._counts)
        rows = session.execute(
            select(Job.priority, func.count()).where(Job.status == JobStatus.QUEUED).group_by(Job.priority)
        )
        counts = {p: int(n) for p, n in rows}
        with self._lock:
            self._counts, self._at = counts, time.monotonic()
        return counts

    def submitted(self, priority: str) -> None:
        with self._lock:
            self._counts[priority] = self._counts.get(priority, 0) + 1

    def positions(self, session: Session, jobs: Sequence[Job]) -> dict[uuid.UUID, int]:
        """1-based approximate place of each queued, computing job; cached followers have none."""
        queued = [j for j in jobs if j.status == JobStatus.QUEUED and not j.cached]
        if not queued:
            return {}
        totals = self.totals(session)
        rows = session.execute(self._older_stmt(), {"ids": [j.id for j in queued]})
        older = {jid: int(n) for jid, n in rows}
        out = {}
        for job in queued:
            rank = RANK.get(job.priority, RANK["normal"])
            higher = sum(n for p, n in totals.items() if RANK.get(p, RANK["normal"]) < rank)
            out[job.id] = higher + older.get(job.id, 0) + 1
        return out

    def position_of_new(self, job: Job) -> int:
        """A job just submitted is behind every queued job of its priority and above: no query."""
        with self._lock:
            counts = dict(self._counts)
        rank = RANK.get(job.priority, RANK["normal"])
        return sum(n for p, n in counts.items() if RANK.get(p, RANK["normal"]) <= rank)

    def positions_of_new(self, jobs: Sequence[Job]) -> list[int]:
        """position_of_new for jobs just submitted together (a batch, each counted), in their order:
        each is ahead of the batch's later jobs of its own priority, not of higher ones."""
        with self._lock:
            counts = dict(self._counts)
        later: dict[str, int] = {}
        out = []
        for job in reversed(jobs):
            rank = RANK.get(job.priority, RANK["normal"])
            ahead = sum(n for p, n in counts.items() if RANK.get(p, RANK["normal"]) <= rank)
            out.append(ahead - later.get(job.priority, 0))
            later[job.priority] = later.get(job.priority, 0) + 1
        return out[::-1]
