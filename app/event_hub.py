"""One listener per web process wakes the event streams of the jobs whose events it hears of.

Each process holds one dedicated Postgres connection in LISTEN (outside the pool) in one
thread (a greenlet under gunicorn's gevent worker); a stream registers its job and sleeps
on an Event, holding no pooled connection, and reads new rows only when woken. After a
(re)connect every stream is woken once, since notifications sent while nobody listened are
gone; the rows are not. Without a listener (SQLite, or Postgres unreachable) streams fall
back to reading every `poll_s`.

The hub also admits streams: at most `max_streams` per process and `max_per_tenant` per
tenant in this process, so streams cannot take every connection slot of a worker.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

import psycopg
from sqlalchemy import Engine

from app.errors import ServiceUnavailable, TooManyRequests
from models import events

log = logging.getLogger("genqueue.api")
_TICK_S = 1.0  # how soon an idle listener notices it has no stream left


@dataclass(eq=False)
class Subscription:
    """A stream's registration: `wake` is set when its job has news.

    `rows`: new stored events were announced (read them); `progress`: the highest ephemeral
    progress announced since the stream last took it (a progress move needs no read at all).
    """

    job_id: uuid.UUID
    tenant_id: uuid.UUID
    wake: threading.Event = field(default_factory=threading.Event)
    rows: bool = True
    progress: int = -1

    def take(self) -> tuple[bool, int]:
        """(rows announced, progress announced) since the last take; resets both."""
        rows, progress = self.rows, self.progress
        self.rows, self.progress = False, -1
        return rows, progress


class EventHub:
    def __init__(self, engine: Engine, max_streams: int, max_per_tenant: int, poll_s: float) -> None:
        self.max_streams, self.max_per_tenant, self.poll_s = max_streams, max_per_tenant, poll_s
        url = engine.url
        self._conninfo = (
            url.set(drivername="postgresql").render_as_string(hide_password=False)
            if url.get_backend_name() == "postgresql"
            else None
        )
        self._subs: dict[uuid.UUID, set[Subscription]] = {}
        self._tenants: dict[uuid.UUID, int] = {}
        self._count = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.live = False  # a listener is connected: notifications arrive, no polling needed

    # -- admission -------------------------------------------------------------------------------
    def subscribe(self, job_id: uuid.UUID, tenant_id: uuid.UUID) -> Subscription:
        """Register a stream, or raise 503 (process full) / 429 (tenant's streams full)."""
        with self._lock:
            if self._count >= self.max_streams:
                raise ServiceUnavailable(
                    "Too many event streams on this server; retry shortly.", retry_after=5, reason="streams"
                )
            if self._tenants.get(tenant_id, 0) >= self.max_per_tenant:
                raise TooManyRequests(
                    f"At most {self.max_per_tenant} concurrent event streams per tenant.",
                    retry_after=5,
                    reason="streams",
                )
            sub = Subscription(job_id, tenant_id)
            self._count += 1
            self._tenants[tenant_id] = self._tenants.get(tenant_id, 0) + 1
            self._subs.setdefault(job_id, set()).add(sub)
            if self._conninfo and self._thread is None:
                self._thread = threading.Thread(target=self._listen, name="job-events", daemon=True)
                self._thread.start()
            return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.job_id)
            if subs is None or sub not in subs:
                return
            subs.discard(sub)
            if not subs:
                del self._subs[sub.job_id]
            self._count -= 1
            left = self._tenants[sub.tenant_id] - 1
            if left:
                self._tenants[sub.tenant_id] = left
            else:
                del self._tenants[sub.tenant_id]

    @property
    def streams(self) -> int:
        return self._count

    # -- notifications ---------------------------------------------------------------------------
    def wait(self, sub: Subscription, timeout_s: float) -> tuple[bool, int]:
        """Sleep until the job has news or `timeout_s` (at most poll_s while nobody listens);
        then (read the rows?, announced progress or -1). Without a listener: always read."""
        live = self.live
        sub.wake.wait(max(0.0, timeout_s if live else min(timeout_s, self.poll_s)))
        sub.wake.clear()
        with self._lock:
            rows, progress = sub.take()
        return rows or not live, progress

    def _wake(self, job_id: uuid.UUID | None, progress: int | None = None) -> None:
        """Wake `job_id`'s streams (None: every stream, to re-read) with what they were told."""
        with self._lock:
            if job_id is None:
                targets = [s for subs in self._subs.values() for s in subs]
            else:
                targets = list(self._subs.get(job_id, ()))
            for sub in targets:
                if progress is None:
                    sub.rows = True
                else:
                    sub.progress = max(sub.progress, progress)
        for sub in targets:
            sub.wake.set()

    def _idle(self) -> bool:
        """True (and the thread is forgotten) when no stream is left: the listener then exits,
        closing its connection; the next stream starts another."""
        with self._lock:
            if self._count:
                return False
            self._thread, self.live = None, False
            return True

    def _listen(self) -> None:
        """Listen while streams are registered; reconnect after a failure (pausing poll_s)."""
        assert self._conninfo is not None
        while not self._idle():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=3) as conn:
                    conn.execute(f"LISTEN {events.CHANNEL}")
                    self.live = True
                    self._wake(None)  # whatever was sent before LISTEN: every stream re-reads once
                    while not self._idle():
                        for note in conn.notifies(timeout=_TICK_S):
                            parsed = events.parse(note.payload)
                            if parsed is not None:
                                self._wake(*parsed)
            except psycopg.Error as exc:
                self.live = False
                log.warning("job events listener lost (%s); streams poll meanwhile", type(exc).__name__)
                time.sleep(self.poll_s)
