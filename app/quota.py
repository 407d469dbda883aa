"""Per-tenant concurrency quota: at most `max_active_jobs` queued + running jobs.

The active set of each tenant lives in Redis (one sorted set of job ids, scored by when they
were admitted), so every web process sees the same count and a Lua script checks and adds
atomically: two concurrent submits cannot both take the last slot. Jobs finish in the workers,
which know nothing of this, so the set is reconciled against Postgres (the truth): at most
every SYNC_S seconds per tenant, and always before a job is refused, so a refusal is exact.
A full reconciliation drops ids whose job has finished and ids that never became a row (a submit
that failed) once older than GRACE_S, and adds active jobs the set lacks (Redis was flushed).
It reads every id in the set, so its cost grows with the tenant's backlog: the periodic one is
full only every FULL_SYNC_S per process and tenant, and in between drops just the jobs that
finished since the process's last look (by `completed_at`, an index) and adds what is missing.
With Redis down the quota falls back to counting in Postgres (not atomic, but available).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, Protocol, cast

import redis
from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.orm import Session, sessionmaker

from models import Job
from models.base import utcnow
from models.db import among
from models.job import ACTIVE

log = logging.getLogger("genqueue.api")

SYNC_S = 5.0
FULL_SYNC_S = 60.0  # a full reconciliation at least this often (per process and tenant)
# Finished jobs are looked up from this long before the last look: a finish committed late, or
# stamped by a worker whose clock runs behind (a longer lag is left to the next full one).
FINISHED_MARGIN_S = 30.0
GRACE_S = 60.0  # longer than any submit takes between reserving and committing its row
CHUNK = 500  # ids per reconciliation step: memory stays flat however large the backlog grows

# ARGV: score, limit, then the members: all of them fit under the limit together, or none is added
# (a batch submit reserves its jobs' slots in this one round trip).
_RESERVE = """
if redis.call('ZCARD', KEYS[1]) + #ARGV - 2 > tonumber(ARGV[2]) then return 0 end
for i = 3, #ARGV do redis.call('ZADD', KEYS[1], ARGV[1], ARGV[i]) end
redis.call('EXPIRE', KEYS[1], 86400)
return 1
"""


# KEYS: the set, its reconciliation marker. ARGV: score, limit, marker lifetime (ms), then the
# members. -1: the marker had lapsed (now set again): reconcile first, nothing added; else _RESERVE's
# answer. One round trip for a submit when no reconciliation is due (most of them).
_RESERVE_UNLESS_DUE = """
if redis.call('SET', KEYS[2], 1, 'NX', 'PX', ARGV[3]) then return -1 end
if redis.call('ZCARD', KEYS[1]) + #ARGV - 3 > tonumber(ARGV[2]) then return 0 end
for i = 4, #ARGV do redis.call('ZADD', KEYS[1], ARGV[1], ARGV[i]) end
redis.call('EXPIRE', KEYS[1], 86400)
return 1
"""

DUE = -1


class _Store(Protocol):
    def reserve_unless_due(
        self, key: str, members: list[str], score: float, limit: int, every_s: float
    ) -> int: ...
    def try_add(self, key: str, members: list[str], score: float, limit: int) -> bool: ...
    def chunks(self, key: str, size: int) -> Iterator[dict[str, float]]: ...
    def count(self, key: str) -> int: ...
    def remove(self, key: str, members: list[str]) -> None: ...
    def add_missing(self, key: str, members: list[str], score: float) -> None: ...


class RedisStore:
    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        self.reserve = self.client.register_script(_RESERVE)
        self.reserve_or_due = self.client.register_script(_RESERVE_UNLESS_DUE)

    def reserve_unless_due(
        self, key: str, members: list[str], score: float, limit: int, every_s: float
    ) -> int:
        """DUE when the set is due for reconciliation (nothing added), else 1 added / 0 full."""
        args: list[float | int | str] = [score, limit, int(every_s * 1000), *members]
        return int(self.reserve_or_due(keys=[key, f"{key}:synced"], args=args))

    def try_add(self, key: str, members: list[str], score: float, limit: int) -> bool:
        return bool(self.reserve(keys=[key], args=[score, limit, *members]))

    def chunks(self, key: str, size: int) -> Iterator[dict[str, float]]:
        chunk: dict[str, float] = {}
        for member, score in self.client.zscan_iter(key, count=size):
            chunk[member.decode()] = score
            if len(chunk) >= size:
                yield chunk
                chunk = {}
        if chunk:
            yield chunk

    def count(self, key: str) -> int:
        return cast(int, self.client.zcard(key))  # redis-py types sync and asyncio replies alike

    def remove(self, key: str, members: list[str]) -> None:
        if members:
            self.client.zrem(key, *members)

    def add_missing(self, key: str, members: list[str], score: float) -> None:
        if members:
            self.client.zadd(key, dict.fromkeys(members, score), nx=True)


class MemoryStore:
    """One process only (the embedded mode, with the limiter's memory storage)."""

    def __init__(self) -> None:
        self.sets: dict[str, dict[str, float]] = {}
        self.synced: dict[str, float] = {}
        self.lock = threading.Lock()

    def reserve_unless_due(
        self, key: str, members: list[str], score: float, limit: int, every_s: float
    ) -> int:
        if self.due(key, every_s):
            return DUE
        return int(self.try_add(key, members, score, limit))

    def try_add(self, key: str, members: list[str], score: float, limit: int) -> bool:
        with self.lock:
            held = self.sets.setdefault(key, {})
            if len(held) + len(members) > limit:
                return False
            held.update(dict.fromkeys(members, score))
            return True

    def chunks(self, key: str, size: int) -> Iterator[dict[str, float]]:
        with self.lock:
            items = list(self.sets.get(key, {}).items())
        for start in range(0, len(items), size):
            yield dict(items[start : start + size])

    def count(self, key: str) -> int:
        with self.lock:
            return len(self.sets.get(key, {}))

    def remove(self, key: str, members: list[str]) -> None:
        with self.lock:
            for m in members:
                self.sets.get(key, {}).pop(m, None)

    def add_missing(self, key: str, members: list[str], score: float) -> None:
        with self.lock:
            for m in members:
                self.sets.setdefault(key, {}).setdefault(m, score)

    def due(self, key: str, every_s: float) -> bool:
        with self.lock:
            now = time.monotonic()
            if now < self.synced.get(key, 0.0):
                return False
            self.synced[key] = now + every_s
            return True


@functools.cache
def _statuses(on_postgres: bool) -> Select[uuid.UUID, str]:
    return select(Job.id, Job.status).where(among(Job.id, "ids", on_postgres))


@functools.cache
def _finished() -> Select[uuid.UUID]:
    # ix_jobs_finished_at finds them; every finishing transition sets completed_at (models.states).
    return select(Job.id).where(Job.completed_at >= bindparam("since"), Job.tenant_id == bindparam("tenant"))


class ActiveJobs:
    """Reserve a slot for a job before its row is written; release it if the submit fails."""

    def __init__(self, storage_uri: str, sessions: sessionmaker[Session]) -> None:
        self.store: _Store = MemoryStore() if storage_uri.startswith("memory") else RedisStore(storage_uri)
        self.sessions = sessions
        # key -> (when this process last looked for finished jobs, monotonic time of its last full one)
        self._looked: dict[str, tuple[datetime, float]] = {}

    @staticmethod
    def _key(tenant_id: uuid.UUID) -> str:
        return f"genqueue:active:{tenant_id}"

    def reserve(self, tenant_id: uuid.UUID, job_ids: list[uuid.UUID], limit: int) -> tuple[bool, int]:
        """(admitted, active count seen): a slot for every job in `job_ids`, or for none of them.

        Falls back to a Postgres count when Redis is down."""
        key, members = self._key(tenant_id), [str(j) for j in job_ids]
        try:
            added = self.store.reserve_unless_due(key, members, time.time(), limit, SYNC_S)
            if added == 1:
                return True, -1
            if added == DUE:
                self._sync(tenant_id, key)  # the periodic one: full only every FULL_SYNC_S
                if self.store.try_add(key, members, time.time(), limit):
                    return True, -1
            self._sync(tenant_id, key, full=True)  # refuse only on fresh numbers
            if self.store.try_add(key, members, time.time(), limit):
                return True, -1
            return False, self.store.count(key)
        except redis.RedisError as exc:
            log.warning("quota store unavailable (%s); counting in the database", type(exc).__name__)
            active = self._count(tenant_id)
            return active + len(members) <= limit, active

    def release(self, tenant_id: uuid.UUID, job_ids: list[uuid.UUID]) -> None:
        try:
            self.store.remove(self._key(tenant_id), [str(j) for j in job_ids])
        except redis.RedisError:
            pass  # the next reconciliation drops them

    def _count(self, tenant_id: uuid.UUID) -> int:
        with self.sessions() as s:
            stmt = select(func.count()).where(Job.tenant_id == tenant_id, Job.status.in_(ACTIVE))
            return int(s.scalar(stmt) or 0)

    def _sync(self, tenant_id: uuid.UUID, key: str, full: bool = False) -> None:
        """Make the set match Postgres: in full (`full`, the first time, every FULL_SYNC_S), else by
        dropping the jobs finished since this process last looked. Both add what the set lacks."""
        looked, now = self._looked.get(key), utcnow()
        if full or looked is None or time.monotonic() - looked[1] >= FULL_SYNC_S:
            self._full_sync(key)
            self._looked[key] = (now, time.monotonic())
        else:
            since = looked[0] - timedelta(seconds=FINISHED_MARGIN_S)
            with self.sessions() as s:
                done = s.scalars(_finished(), {"tenant": tenant_id, "since": since}).all()
            for start in range(0, len(done), CHUNK):
                self.store.remove(key, [str(j) for j in done[start : start + CHUNK]])
            self._looked[key] = (now, looked[1])
        self._add_missing(tenant_id, key)

    def _full_sync(self, key: str) -> None:
        """Drop every id whose job has finished or never came, CHUNK ids at a time (the set's
        size is the tenant's backlog)."""
        cutoff = time.time() - GRACE_S
        for chunk in self.store.chunks(key, CHUNK):
            with self.sessions() as s:
                stmt = _statuses(s.get_bind().dialect.name == "postgresql")
                rows: Any = s.execute(stmt, {"ids": [uuid.UUID(m) for m in chunk]}).all()
            status = {str(r.id): r.status for r in rows}
            gone = [
                m
                for m, admitted in chunk.items()
                if (m in status and status[m] not in ACTIVE) or (m not in status and admitted < cutoff)
            ]
            self.store.remove(key, gone)

    def _add_missing(self, tenant_id: uuid.UUID, key: str) -> None:
        """Add the tenant's active jobs the set lacks (Redis lost it), when its count says so."""
        if self._count(tenant_id) <= self.store.count(key):
            return  # nothing is missing (the usual case): no need to list the active jobs
        active = select(Job.id).where(Job.tenant_id == tenant_id, Job.status.in_(ACTIVE))
        with self.sessions() as s:
            for part in s.execute(active.execution_options(yield_per=CHUNK)).partitions():
                self.store.add_missing(key, [str(r.id) for r in part], time.time())
