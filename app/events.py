"""GET /v1/jobs/{id}/events: the job's events as a page of JSON, or live as Server-Sent Events.

A stream replays the stored events after the client's cursor (`Last-Event-ID` or `?after=`),
then sleeps until the process's listener (app.event_hub) hears of news for the job, and reads
the rows with id > the last one sent: replay and live are one loop over the database, so
nothing falls between them and nothing is sent twice. Between stored events it passes on
the job's progress (ephemeral `job.progress` events, without an `id:`), sends a comment
line after `stream_heartbeat_s` of silence, and ends after the terminal event (a succeeded
job's output variants still to come: after the last `job.variant.completed`). While it
sleeps it holds no database connection, only its greenlet and socket.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.auth import owned, tenant_id
from app.errors import NotFound, ValidationFailed
from app.event_hub import EventHub, Subscription
from app.services import extension, services
from models import Job, JobStatus, events, variants
from models.db import read_only
from models.settings import Settings

bp = Blueprint("events", __name__, url_prefix="/v1")

STREAM = "text/event-stream"
MAX_PAGE = 500
RETRY_MS = 2000  # the reconnect delay a browser's EventSource uses after a drop


def hub() -> EventHub:
    ext = current_app.extensions
    if "genqueue.event_hub" not in ext:
        svc = services()
        st = svc.settings
        ext["genqueue.event_hub"] = EventHub(
            svc.engine, st.stream_max_per_process, st.stream_max_per_tenant, st.stream_poll_s
        )
    return extension("genqueue.event_hub", EventHub)


def _cursor(name: str, raw: str | None) -> int:
    if raw is None:
        return 0
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise ValidationFailed(errors=[{"field": name, "message": "must be a non-negative integer event id"}])
    return int(raw)


def _limit(raw: str | None) -> int:
    if raw is None:
        return 100
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE or raw[0] == "0":
        message = f"must be an integer from 1 to {MAX_PAGE}"
        raise ValidationFailed(errors=[{"field": "limit", "message": message}])
    return int(raw)


def _owned_job(session: Session, raw_id: str) -> uuid.UUID:
    """The caller's job id; another tenant's job is as absent as a missing one (404)."""
    try:
        jid = uuid.UUID(raw_id)
    except ValueError:
        raise NotFound(f"No job with id {raw_id!r}.") from None
    if session.scalar(owned(select(Job.id).where(Job.id == jid))) is None:
        raise NotFound(f"No job with id {raw_id!r}.")
    return jid


@bp.get("/jobs/<job_id>/events")
def job_events(job_id: str) -> Response:
    wants_stream = request.accept_mimetypes.best_match(["application/json", STREAM]) == STREAM
    # Both are checked when both are sent (a malformed one is a 422 either way); `?after=` wins.
    resumed = _cursor("Last-Event-ID", request.headers.get("Last-Event-ID"))
    after = _cursor("after", request.args.get("after")) if "after" in request.args else resumed
    limit = _limit(request.args.get("limit"))
    svc = services()
    with read_only(svc.sessions) as s:
        jid = _owned_job(s, job_id)
        if not wants_stream:
            rows = events.after(s, jid, after, limit + 1)
            return jsonify(events.page(rows[:limit], after, has_more=len(rows) > limit))
    sub = hub().subscribe(jid, tenant_id())
    stream = _Stream(hub(), sub, _stream(svc.sessions, svc.settings, hub(), sub, after))
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies must not buffer it
    return Response(stream, mimetype=STREAM, headers=headers)


class _Stream:
    """The response body; the server's close() frees the slot even if the body never started
    (a generator's `finally` runs only once it has)."""

    def __init__(self, hub: EventHub, sub: Subscription, body: Iterator[bytes]) -> None:
        self.hub, self.sub, self.body = hub, sub, body

    def __iter__(self) -> Iterator[bytes]:
        return self.body

    def close(self) -> None:
        close = getattr(self.body, "close", None)
        if close is not None:
            close()
        self.hub.unsubscribe(self.sub)


def _frame(event: str, data: dict[str, Any], event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _read(
    sessions: sessionmaker[Session], jid: uuid.UUID, after: int
) -> tuple[list[Any], tuple[int, str | None, bool] | None]:
    """New stored events (all of them, in pages) and the job's (progress, stage, variants still
    to come), in one short session; None for the job when it is gone.

    The job first: a variant recorded after that read has its event among the rows or in a later
    read, so a stream that sees no variant pending has already been given every variant's event.
    """
    with read_only(sessions) as s:
        columns = (Job.progress, Job.stage, Job.status, Job.variants)
        job = s.execute(select(*columns).where(Job.id == jid)).first()
        rows: list[Any] = []
        while True:
            page = events.after(s, jid, rows[-1].id if rows else after, MAX_PAGE)
            rows.extend(page)
            if len(page) < MAX_PAGE:
                break
        if job is None:
            return rows, None
        pending = job.status == JobStatus.SUCCEEDED and bool(variants.pending_in(job.variants))
        return rows, (job.progress, job.stage, pending)


def _stream(
    sessions: sessionmaker[Session], settings: Settings, hub: EventHub, sub: Subscription, after: int
) -> Iterator[bytes]:
    """The SSE body; its `finally` (the client left, or the end) frees the stream's slot too.

    A wake that announced only a progress move sends it without reading anything; one that
    announced stored events (or any wake while polling) reads the rows after the last sent.
    """
    try:
        yield f"retry: {RETRY_MS}\n\n".encode()
        last, progress, stage = after, -1, None
        started = sent = time.monotonic()
        read, announced, finished = True, -1, False
        while True:
            if read:
                rows, job = _read(sessions, sub.job_id, last)  # the only time a connection is held
                for row in rows:
                    last, sent = row.id, time.monotonic()
                    yield _frame(row.type, events.public(row), row.id)
                    if row.type == "job.progress":
                        progress = max(progress, int((row.data or {}).get("progress", 0)))
                    finished = finished or row.type in events.TERMINAL_EVENTS
                if job is None:
                    return  # withdrawn: a submit that was never accepted
                if finished and not job[2]:
                    return  # the end, and no output variant still to be announced
                announced, stage = max(announced, job[0]), job[1]
            if announced > progress:
                progress, sent = announced, time.monotonic()
                yield _frame("job.progress", events.progress_event(progress, stage))
            now = time.monotonic()
            if now - started >= settings.stream_max_duration_s:
                return
            if now - sent >= settings.stream_heartbeat_s:
                sent = now
                yield b": heartbeat\n\n"
            read, announced = hub.wait(sub, settings.stream_heartbeat_s - (now - sent))
    finally:
        hub.unsubscribe(sub)
