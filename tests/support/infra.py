"""Where the shared test servers are: Postgres's admin database and the Redis host (overridable)."""

from __future__ import annotations

import os

PG_ADMIN = os.environ.get("GENQUEUE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_HOST = os.environ.get("GENQUEUE_TEST_REDIS", "redis://127.0.0.1:6379")
