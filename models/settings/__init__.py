"""Runtime settings read from the environment, shared by the web front and the workers.

One class, Settings, composed of a model per group of fields (the modules of this package, in
docs/SETTINGS.md's order); a setting is added to its group's module.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from models.settings.operations import OperationsSettings
from models.settings.reliability import ReliabilitySettings
from models.settings.serving import ServingSettings
from models.settings.storage import StorageSettings
from models.settings.tenancy import TenancySettings
from models.settings.webhooks import WebhookSettings
from models.settings.workers import WorkerSettings

# docs/SETTINGS.md is generated from the fields (python -m models.settings_doc), grouped by
# models.settings_doc.GROUPS; tests/test_settings_doc.py fails when it is stale or a field has no
# description.

__all__ = ["Settings", "from_environment"]


# pydantic puts the fields of the last base first: the groups are listed last to first so the
# fields keep the documented order (storage first, operations last).
class Settings(
    OperationsSettings,
    TenancySettings,
    ServingSettings,
    WebhookSettings,
    ReliabilitySettings,
    WorkerSettings,
    StorageSettings,
    BaseSettings,
):
    """Every knob in one place. Env names: GENQUEUE_<FIELD>, plus DATABASE_URL and BROKER_URL."""

    model_config = SettingsConfigDict(env_prefix="GENQUEUE_", extra="ignore")

    @property
    def worker_metrics_files(self) -> Path:
        """The worker's private prometheus multiprocess directory: `<worker_metrics_dir>/<port>`."""
        return (self.worker_metrics_dir / str(self.worker_metrics_port)).resolve()

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def ratelimit_storage_uri(self) -> str:
        """Where rate-limit counters and quota reservations live, shared by every web process."""
        if self.ratelimit_url:
            return self.ratelimit_url
        if self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return "redis://127.0.0.1:6379/0"


def from_environment() -> Settings:
    """Settings read from the environment, for code that no caller hands a Settings.

    The adapters the registry builds (the echo video adapter, SmolLM2's cache) and other
    process-level reads go through here rather than os.environ, so every GENQUEUE_ variable is a
    documented field. Building Settings costs ~5 ms, too much for the echo adapter's per-batch
    read, so the result is reused while the variables it reads are unchanged (tests change the
    environment of a running process; a change is seen on the next call). A copy is returned,
    so a caller that changes it changes only its own.
    """
    return _from_environment(_settings_environ()).model_copy()


def _settings_environ() -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted((k, v) for k, v in os.environ.items() if k.upper().startswith("GENQUEUE_") or k in _ALIASES)
    )


_ALIASES = frozenset({"DATABASE_URL", "BROKER_URL"})


@functools.lru_cache(maxsize=4)
def _from_environment(environ: tuple[tuple[str, str], ...]) -> Settings:
    return Settings()  # `environ` is the cache key: Settings reads os.environ itself
