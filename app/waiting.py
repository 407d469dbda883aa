"""`Prefer: wait=N` on submit: one poller thread per process watches every waiting job at once."""

from __future__ import annotations

import logging
import re
import threading
import uuid

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from models import Job
from models.job import TERMINAL

log = logging.getLogger("genqueue.api")
_WAIT = re.compile(r"(?:^|[,;\s])wait\s*=\s*\"?(\d+)\"?", re.IGNORECASE)


def prefer_wait(header: str | None, cap: int) -> int:
    """Seconds asked for by an RFC 7240 `Prefer: wait=N` header (0: none), capped."""
    match = _WAIT.search(header or "")
    return min(int(match.group(1)), cap) if match else 0


class Waiters:
    """Request threads block on an Event (holding no database connection); one thread polls the
    database for all of them with a single query per tick, so N waiting clients cost one query
    per interval, not N. The number of concurrent waiters is capped so they cannot take every
    server thread: past the cap a submit answers at once (the preference is optional)."""

    def __init__(self, sessions: sessionmaker[Session], limit: int, interval_s: float = 0.05) -> None:
        self.sessions, self.limit, self.interval_s = sessions, limit, interval_s
        self._events: dict[uuid.UUID, list[threading.Event]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._count = 0

    def wait(self, job_id: uuid.UUID, timeout_s: float) -> bool:
        """True if the job finished within timeout_s; False on timeout or when over the cap."""
        event = threading.Event()
        with self._lock:
            if self._count >= self.limit:
                return False
            self._count += 1
            self._events.setdefault(job_id, []).append(event)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._poll, name="prefer-wait", daemon=True)
                self._thread.start()
            self._wake.notify()
        try:
            return event.wait(timeout_s)
        finally:
            with self._lock:
                self._count -= 1
                events = self._events.get(job_id, [])
                if event in events:
                    events.remove(event)
                if not events:
                    self._events.pop(job_id, None)

    def _poll(self) -> None:
        while True:
            with self._lock:
                while not self._events:
                    self._wake.wait()
                ids = list(self._events)
            try:
                with self.sessions() as s:
                    done = set(
                        s.scalars(select(Job.id).where(Job.id.in_(ids), Job.status.in_(list(TERMINAL))))
                    )
            except Exception:  # a database blip: waiters time out at worst
                log.warning("Prefer: wait poll failed", exc_info=True)
                done = set()
            with self._lock:
                for jid in done:
                    for event in self._events.get(jid, []):
                        event.set()
                self._wake.wait(self.interval_s)
