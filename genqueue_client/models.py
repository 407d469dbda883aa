"""What the API returns, as light typed views over the JSON (`raw` keeps every member)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FINISHED = frozenset({"succeeded", "failed", "canceled"})
TERMINAL_EVENTS = frozenset({"job.succeeded", "job.failed", "job.canceled"})


@dataclass(frozen=True)
class Job:
    """A job resource (`GET /v1/jobs/{id}`); `raw` is the whole object as the server sent it."""

    id: str
    status: str
    stage: str | None
    progress: int
    modality: str
    outputs: dict[str, Any]
    error: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Job:
        return cls(
            id=str(body["id"]),
            status=str(body["status"]),
            stage=body.get("stage"),
            progress=int(body.get("progress") or 0),
            modality=str(body.get("modality") or ""),
            outputs=dict(body.get("outputs") or {}),
            error=body.get("error"),
            raw=body,
        )

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def text(self) -> str | None:
        value = self.outputs.get("text")
        return None if value is None else str(value)

    @property
    def variants(self) -> dict[str, Any]:
        """A video job's output variants by name (status, url, bytes, error); {} when it asked for none."""
        return dict(self.raw.get("variants") or {})


@dataclass(frozen=True)
class Event:
    """A job event: a stored one (an `id`, replayable) or a live `job.progress` (id None)."""

    id: int | None
    type: str
    stage: str | None
    data: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Event:
        raw_id = body.get("id")
        return cls(
            id=None if raw_id is None else int(raw_id),
            type=str(body.get("type") or ""),
            stage=body.get("stage"),
            data=dict(body.get("data") or {}),
            raw=body,
        )

    @property
    def terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS

    @property
    def progress(self) -> int | None:
        value = self.data.get("progress")
        return None if value is None else int(value)


@dataclass(frozen=True)
class Model:
    """A model a job may name (`GET /v1/models`); `raw` has the rest (params schema, queue...)."""

    id: str
    stage: str
    default: bool
    allowed: bool
    warm: bool | None
    version: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Model:
        return cls(
            id=str(body["id"]),
            stage=str(body["stage"]),
            default=bool(body.get("default")),
            allowed=bool(body.get("allowed", True)),
            warm=body.get("warm"),
            version=str(body.get("version") or ""),
            raw=body,
        )


@dataclass(frozen=True)
class Page:
    """One page of `GET /v1/jobs`."""

    data: list[Job]
    next_cursor: str | None


@dataclass(frozen=True)
class EventPage:
    """One page of `GET /v1/jobs/{id}/events` (JSON)."""

    data: list[Event]
    has_more: bool
    next_after: int
