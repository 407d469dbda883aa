"""Records `published_at` for submitted jobs in batches, off the request thread.

Each submit used to spend a second transaction on `published_at` after its publish. A
published job runs whether or not the mark is written: the mark only tells the reaper that
a message exists. So the API hands the id to this per-process recorder, which writes
every id gathered over `interval_s` in one UPDATE. If a mark is lost (the process dies
first, the database is briefly down), the reaper republishes that job after
`publish_grace_s`: a second message for a job that has one, which the idempotent stages
ignore. Nothing is lost or run twice; the cost is one redundant message.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
import weakref

from sqlalchemy.orm import Session, sessionmaker

from models import job_writes
from models.base import utcnow
from models.db import transaction

log = logging.getLogger("genqueue.api")
IDLE_EXIT_S = 5.0


class PublishedMarks:
    """A queue of ids and one daemon thread that drains it (started on first use, per process)."""

    def __init__(self, sessions: sessionmaker[Session], interval_s: float = 0.05) -> None:
        self.sessions = sessions
        self.interval_s = interval_s
        self._cond = threading.Condition()
        self._pending: list[uuid.UUID] = []
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, job_id: uuid.UUID) -> None:
        with self._cond:
            self._pending.append(job_id)
            if self._thread is None or self._pid != os.getpid():  # a forked child starts its own
                if self._pid != os.getpid():  # weakly: a dropped app must not live on for this
                    atexit.register(_flush_at_exit, weakref.ref(self))
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name="published-marks", daemon=True)
                self._thread.start()
            self._cond.notify()

    def flush(self) -> int:
        """Write every pending mark now; returns how many jobs were marked."""
        with self._cond:
            ids, self._pending = self._pending, []
        if not ids:
            return 0
        try:
            with transaction(self.sessions) as s:
                return job_writes.mark_published_many(s, ids, utcnow())
        except Exception:
            log.exception("published_at not recorded for %d jobs (the reaper republishes them)", len(ids))
            return 0

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._pending:
                    self._cond.wait(IDLE_EXIT_S)
                if not self._pending:
                    # Idle: end, so a dropped app's engine and connections are not kept alive by
                    # this thread; the next add() starts a new one.
                    self._thread = None
                    return
            # Let the other requests of this moment join the same UPDATE.
            time.sleep(self.interval_s)
            self.flush()


def _flush_at_exit(ref: weakref.ref[PublishedMarks]) -> None:
    marks = ref()
    if marks is not None:
        marks.flush()
