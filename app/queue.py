"""Approximate queue positions in O(1) per read: a job's enqueue number within its priority's lane,
placed between the lane's first and last queued numbers (per-process lane statistics)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Connection, Select, func, select, text
from sqlalchemy.orm import Session

from models import Job

RANK = {"high": 0, "normal": 1, "low": 2}  # the order workers take them (broker priorities)


class Queued(Protocol):
    """What a position needs of a job: an ORM row or a Core row of the by-id read."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def status(self) -> str: ...
    @property
    def cached(self) -> bool: ...
    @property
    def priority(self) -> str: ...
    @property
    def queue_seq(self) -> int | None: ...


@dataclass
class Lane:
    """One priority's queued, computing jobs: how many, and their first and last enqueue numbers."""

    count: int
    first: int | None
    last: int | None

    def place(self, seq: int | None) -> int:
        """1-based place of the job numbered `seq` in this lane.

        Exact while the numbers between `first` and `last` are all still queued (jobs leave from
        the front: workers take them in order). A job that left from the middle (canceled,
        expired, taken out of order) leaves a gap; the gaps are spread evenly between first and
        last, so a place is off by at most the gaps ahead of it. Numbers past `last` (submitted
        since the statistics were read) count one each.
        """
        if seq is None or self.first is None or self.last is None:
            return max(self.count, 1)  # no number (a promoted follower) or no statistics: the back
        if seq > self.last:
            return self.count + (seq - self.last)
        if seq <= self.first or self.last == self.first:
            return 1
        return 1 + int((seq - self.first) * (self.count - 1) / (self.last - self.first) + 0.5)


# One index-only pass over the queued part of ix_jobs_queue_lane (computing jobs: a partial
# index). `NOT cached` is literal SQL, not a bound value, so the planner matches the index's.
_LANES: Select[str, int, int | None, int | None] = (
    select(Job.priority, func.count(), func.min(Job.queue_seq), func.max(Job.queue_seq))
    .where(Job.status == "queued", text("NOT jobs.cached"))
    .group_by(Job.priority)
)


class QueueCounts:
    """Each lane's statistics, re-read at most every `ttl_s` seconds per process.

    A position is (queued jobs of higher priority) + (the job's place in its own lane, from its
    enqueue number: Lane.place). Reading the statistics is a pass over the backlog's index,
    once per TTL; a read of a position costs no statement. Between re-reads, submits through
    this process extend their lane, so the figures stay close.
    """

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._lanes: dict[str, Lane] = {}
        self._at = -float("inf")
        self._read = False  # figures from the database yet (until then every caller reads)

    def totals(self, session: Session | Connection) -> dict[str, Lane]:
        """Each lane's statistics, re-read when the last reading is older than the TTL."""
        with self._lock:
            now = time.monotonic()
            if now - self._at < self.ttl_s:
                return dict(self._lanes)
            if self._read:
                # One re-read at a time: the requests arriving meanwhile use the last figures
                # rather than each scanning the backlog again (measured: at 20k queued and a few
                # hundred polls a second, a herd of re-reads cost more than the polls' own reads).
                self._at = now
        lanes = {p: Lane(int(n), first, last) for p, n, first, last in session.execute(_LANES)}
        with self._lock:
            self._lanes, self._at, self._read = lanes, time.monotonic(), True
        return dict(lanes)

    def submitted(self, priority: str) -> None:
        """A job of `priority` was queued through this process: its lane is one longer."""
        with self._lock:
            lane = self._lanes.setdefault(priority, Lane(0, None, None))
            lane.count += 1
            if lane.last is not None:
                lane.last += 1  # its number is (about) the next one: no gap at the end

    def positions(self, session: Session | Connection, jobs: Sequence[Queued]) -> dict[uuid.UUID, int]:
        """1-based approximate place of each queued, computing job; cached followers have none."""
        queued = [j for j in jobs if j.status == "queued" and not j.cached]
        if not queued:
            return {}
        lanes = self.totals(session)
        out = {}
        for job in queued:
            rank = RANK.get(job.priority, RANK["normal"])
            higher = sum(lane.count for p, lane in lanes.items() if RANK.get(p, RANK["normal"]) < rank)
            own = lanes.get(job.priority, Lane(0, None, None))
            out[job.id] = higher + own.place(job.queue_seq)
        return out

    def position_of_new(self, job: Job) -> int:
        """A job just submitted is behind every queued job of its priority and above: no query."""
        with self._lock:
            counts = {p: lane.count for p, lane in self._lanes.items()}
        rank = RANK.get(job.priority, RANK["normal"])
        return sum(n for p, n in counts.items() if RANK.get(p, RANK["normal"]) <= rank)

    def positions_of_new(self, jobs: Sequence[Job]) -> list[int]:
        """position_of_new for jobs just submitted together (a batch, each counted), in their order:
        each is ahead of the batch's later jobs of its own priority, not of higher ones (the
        trigger numbered them in their order: one multi-row INSERT)."""
        with self._lock:
            counts = {p: lane.count for p, lane in self._lanes.items()}
        later: dict[str, int] = {}
        out = []
        for job in reversed(jobs):
            rank = RANK.get(job.priority, RANK["normal"])
            ahead = sum(n for p, n in counts.items() if RANK.get(p, RANK["normal"]) <= rank)
            out.append(ahead - later.get(job.priority, 0))
            later[job.priority] = later.get(job.priority, 0) + 1
        return out[::-1]
