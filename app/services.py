"""What the request handlers share (settings, engine, sessions, Celery), and how they find it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from celery import Celery
from flask import current_app
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from models.media_links import MediaSigner
from models.settings import Settings
from models.storage import Storage

EXTENSION = "genqueue"

_T = TypeVar("_T")


@dataclass(frozen=True)
class Services:
    """What the request handlers share: built once per app, never at import time."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    celery: Celery
    artifact_dir: Path
    storage: Storage  # where artifacts are read and removed (models.storage): the workers' too
    metrics: Any  # app.metrics.Metrics
    media_signer: MediaSigner | None = None  # None: no signed links (no keys configured)


def services() -> Services:
    return extension(EXTENSION, Services)


def extension(name: str, kind: type[_T]) -> _T:
    """The current app's extension `name`, checked to be a `kind` (Flask types them all as Any)."""
    value = current_app.extensions[name]
    if not isinstance(value, kind):
        raise TypeError(f"app.extensions[{name!r}] is a {type(value).__name__}, not a {kind.__name__}")
    return value
