"""The test helpers themselves: the tables emptied between tests, and a wait that fails saying why."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from models.base import Base
from tests.support.api import submit, wait_finished


def test_every_migrated_table_is_in_the_metadata_conftest_truncates(engine) -> None:
    # conftest empties Base.metadata's tables before each test: a table the migrations create
    # but no model maps would keep rows from one test to the next.
    migrated = set(inspect(engine).get_table_names()) - {"alembic_version"}
    assert migrated == set(Base.metadata.tables)


def test_wait_finished_fails_with_the_state_the_job_is_stuck_in(client) -> None:
    job_id = submit(client).get_json()["id"]  # no worker: it stays queued
    with pytest.raises(AssertionError, match=f"job /v1/jobs/{job_id} to finish.*it is queued/"):
        wait_finished(client, job_id, timeout=0.3)
