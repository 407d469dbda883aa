"""Operations: the production stack, logs and metrics."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator


class OperationsSettings(BaseModel):
    """Fields of models.settings.Settings (GENQUEUE_<FIELD>)."""

    # -- the production stack (`bin/start`, `genqueue start`: app.stack)
    stop_timeout_s: float = Field(
        60.0,
        description="`genqueue start`: after SIGTERM, how long the processes get to finish (workers their "
        "running tasks, web its requests) before SIGQUIT, then SIGKILL; unfinished tasks are redelivered.",
    )
    flower_basic_auth: SecretStr | None = Field(
        None,
        description="`genqueue flower`: `user:password[,user2:password2]`, the HTTP basic auth of "
        "Flower's UI and API (no comma in a password). Flower refuses to start without it unless "
        "GENQUEUE_FLOWER_UNAUTHENTICATED is `true`.",
    )
    flower_unauthenticated: bool = Field(
        False,
        description="`genqueue flower`: `true` serves Flower's UI and API without authentication, on a "
        "loopback address only (development machines).",
    )

    # -- logs
    log_format: Literal["json", "text"] = Field(
        "json",
        description="`json`: one JSON object per line (with `request_id`, `job_id`, `tenant`, `stage`, "
        "`task_id` where known) from gunicorn, the workers and beat; `text`: plain lines for a terminal. "
        "`genqueue demo` and `genqueue serve` default to `text`.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO",
        description="The lowest level logged. Celery workers and beat take their `-l` level when this is "
        "not set; `genqueue` commands log WARNING unless `-v` or this is set.",
    )

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _case(cls, value: object) -> object:
        # `info` and `JSON` mean what they say
        if not isinstance(value, str):
            return value
        levels = ("debug", "info", "warning", "error", "critical")
        return value.upper() if value.lower() in levels else value.lower()

    # -- metrics (docs/OPERATIONS.md)
    exporter_timeout_s: float = Field(
        2.0,
        gt=0,
        description="`genqueue exporter`: how long one scrape waits for each source (broker, database); "
        "a source past it is reported down (`genqueue_exporter_up 0`), not waited for.",
    )
