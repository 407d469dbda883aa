"""Group commit of concurrent submits in a web process: one INSERT and one publish for every plain
submit that arrived while the previous group was being written.

A submit's own commit and publish were about a third of its CPU at 64 connections (`python -m
bench.profile_api submit`), while a 500-job batch pays for them once. Under load a web process has
many submits in flight at once (gevent), so each joins a group, as in a database's group commit:
the first to arrive when no group is being written writes at once, alone (no wait is added
when the process is idle); those arriving meanwhile queue, and when the write is done the first
of them writes all the queued ones (up to `submit_group_max`) together. Every submit still answers
only once its job is committed and then published, as alone. Only plain submits join: one with an
Idempotency-Key or a result-cache key goes alone (those steps are per request, app.submission).
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field

from flask import current_app

from app import submission
from app.errors import ServiceUnavailable
from app.services import extension, services
from tasks.contract.transient import is_transient

EXTENSION = "genqueue.submit_groups"


@dataclass(eq=False)
class _Entry:
    sub: submission.Submission
    woken: threading.Event = field(default_factory=threading.Event)  # gevent's, in the web workers
    lead: bool = False  # this submit writes the next group
    committed: bool = False  # its row is in: accepted, whatever becomes of the publish (the reaper's)
    written: bool = False  # committed and published
    error: Exception | None = None


class SubmitGroups:
    """The queue of one process's (one app's) submits waiting to be written, and who writes next."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._lock = threading.Lock()
        self._queue: list[_Entry] = []
        self._writing = False

    def submit(self, sub: submission.Submission) -> None:
        """Commit and publish `sub`'s job, with the submits waiting beside it; raises what the
        group's write raised (the caller gives its quota slot back, as for a submit alone)."""
        entry = _Entry(sub)
        with self._lock:
            self._queue.append(entry)
            if not self._writing:
                self._writing = entry.lead = True
        if not entry.lead:
            try:
                entry.woken.wait()  # the group written, or this one chosen to write the next
            except BaseException:  # the request killed while it waited (a worker's shutdown)
                self._abandon(entry)
                raise
        if entry.lead:
            self._write_next()
        if entry.error is not None:
            if entry.lead:
                raise entry.error
            raise _twin(entry.error) from entry.error
        if not entry.committed:  # the writer was interrupted before it recorded the job
            raise ServiceUnavailable("The job could not be recorded; it was not accepted.")
        # Committed but not published (the writer interrupted after the commit): accepted, as a
        # submit whose process dies between its commit and its publish; the reaper publishes it.

    def _write_next(self) -> None:
        with self._lock:
            group, self._queue = self._queue[: self.max_size], self._queue[self.max_size :]
        try:
            _write(group)
        finally:
            # Hand over before waking the group: its requests go on with their answers while the
            # next writer gathers those that queued meanwhile.
            self._hand_over()
            for entry in group:
                entry.woken.set()

    def _hand_over(self) -> None:
        """The first queued submit writes next, or nobody is writing (under no lock: takes it)."""
        with self._lock:
            following = self._queue[0] if self._queue else None
            if following is not None:
                following.lead = True
            else:
                self._writing = False
        if following is not None:
            following.woken.set()

    def _abandon(self, entry: _Entry) -> None:
        """A queued submit that will not wait any more leaves the queue; if it had just been
        chosen to write, the next one is (else every later submit would wait for it forever)."""
        with self._lock:
            if entry not in self._queue:
                return  # already in a group being written
            self._queue.remove(entry)
            chosen = entry.lead
        if chosen:
            self._hand_over()


def _write(group: list[_Entry]) -> None:
    subs = [entry.sub for entry in group]
    try:
        submission.record(subs, None)
    except Exception as exc:
        if len(group) > 1 and not is_transient(exc):
            # Nothing was committed: one job's bad row must not fail its neighbours' submits.
            for entry in group:
                _write([entry])
            return
        for entry in group:
            entry.error = exc
        return
    for entry in group:
        entry.committed = True
    try:
        submission.send([sub.job for sub in subs])
    except Exception as exc:  # nothing went out, and send deleted the jobs again
        for entry in group:
            entry.committed, entry.error = False, exc
        return
    for entry in group:
        entry.written = True


def _twin(exc: Exception) -> Exception:
    """The group's error for one more of its submits: a copy, since raising one object in many
    requests piles all their tracebacks onto it (the class, which decides the answer, is kept)."""
    try:
        return copy.copy(exc)
    except Exception:  # an exception class that cannot be rebuilt from its args
        return exc


_CREATE = threading.Lock()


def submit_groups() -> SubmitGroups:
    ext = current_app.extensions
    with _CREATE:  # one per app, even when two first submits race under real threads
        if EXTENSION not in ext:
            ext[EXTENSION] = SubmitGroups(services().settings.submit_group_max)
    return extension(EXTENSION, SubmitGroups)
