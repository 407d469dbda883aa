"""GET /v1/jobs/{job_id}/events as /openapi.json documents it: the page and the stream (models.events)."""

from __future__ import annotations

from typing import Any

from app.openapi_parts import json_answer, op, param, problems

STREAM_NOTE = (
    "With `Accept: text/event-stream`: Server-Sent Events. Stored events first (those after "
    "`Last-Event-ID` or `after`), then live ones until the terminal event (`job.succeeded`, "
    "`job.failed`, `job.canceled`), after which the stream ends. Each frame is `id:` (the event's "
    "id; stored events only), `event:` (its type) and `data:` (a JobEvent as JSON). `job.progress` "
    "frames without an `id:` are ephemeral: the job's progress as it moves (throttled), not "
    "replayed on resume. A comment line (`: heartbeat`) follows every `stream_heartbeat_s` "
    "(15 s) of silence. Reconnect with `Last-Event-ID` to resume without gaps or duplicates."
)


_CURSOR = {"type": "string", "pattern": "^[0-9]{1,18}$"}


def paths() -> dict[str, Any]:
    job_id = param("job_id", "path", {"type": "string", "format": "uuid"})
    page = json_answer("JobEventList", "A page of the job's stored events, oldest first")
    page["description"] += ". " + STREAM_NOTE
    page["content"]["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "/v1/jobs/{job_id}/events": {
            "get": op(
                "getJobEvents",
                "A job's events: a JSON page, or a live Server-Sent Events stream",
                {"200": page, **problems(404, 422)},
                job_id,
                param("after", "query", _CURSOR, "Only events with a greater id (empty: 422)."),
                param(
                    "limit",
                    "query",
                    {"type": "string", "pattern": "^(?:[1-9][0-9]?|[1-4][0-9]{2}|500)$"},
                    "Page size, 1-500 (default 100; JSON only).",
                ),
                param(
                    "Last-Event-ID",
                    "header",
                    _CURSOR,
                    "Resume after this event id (SSE's reconnect header); `after` wins if both are sent.",
                ),
            )
        }
    }
