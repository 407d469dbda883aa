"""Alembic: one head, upgrade/downgrade/upgrade on Postgres, and the schema matches the models."""
from __future__ import annotations

import uuid

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

import models
from models.migrate import alembic_config, downgrade, upgrade
from tests.support.infra import PG_ADMIN


@pytest.fixture
def scratch_db():
    name = f"gq_mig_{uuid.uuid4().hex[:8]}"
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    yield url
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_single_head() -> None:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1


def test_upgrade_downgrade_upgrade(scratch_db: str) -> None:
    upgrade(scratch_db)
    engine = create_engine(scratch_db)
    assert {"jobs", "job_events"} <= set(inspect(engine).get_table_names())
    downgrade(scratch_db, "base")
    assert not {"jobs", "job_events"} & set(inspect(engine).get_table_names())
    upgrade(scratch_db)
    assert {"jobs", "job_events"} <= set(inspect(engine).get_table_names())
    engine.dispose()


def _diff(url: str) -> list:
    engine = create_engine(url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, models.Base.metadata)
    engine.dispose()
    return diff


def test_schema_matches_models_postgres(scratch_db: str) -> None:
    upgrade(scratch_db)
    assert _diff(scratch_db) == []


def test_schema_matches_models_sqlite(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'gq.db'}"
    upgrade(url)
    assert _diff(url) == []
    command.check(alembic_config(url))
