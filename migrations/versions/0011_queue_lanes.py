"""queue lanes: jobs.queue_seq, a per-priority enqueue sequence number, and its partial index

Every job inserted as queued gets the next number of its priority's lane from the database
itself (a trigger), whatever inserts it: the API's submit, a batch, a bulk INSERT ... SELECT. On
Postgres each lane is a SEQUENCE (non-transactional, no row lock: concurrent submits never
wait on each other); on SQLite (one writer at a time) it is the lane's highest queued number
+ 1. app.queue places a queued job from its number and its lane's first and last queued
numbers, counted once per TTL per process, instead of counting the jobs ahead of it on
every read. Existing queued jobs are numbered in created_at order.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LANES = ("high", "normal", "low")
COMPUTING = sa.text("NOT cached")

PG_FUNCTION = """
CREATE FUNCTION jobs_queue_seq() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.queue_seq IS NULL AND NEW.status = 'queued' THEN
        NEW.queue_seq := nextval(CASE NEW.priority
            WHEN 'high' THEN 'jobs_queue_seq_high'::regclass
            WHEN 'low' THEN 'jobs_queue_seq_low'::regclass
            ELSE 'jobs_queue_seq_normal'::regclass END);
    END IF;
    RETURN NEW;
END $$
"""
SQLITE_TRIGGER = """
CREATE TRIGGER jobs_queue_seq AFTER INSERT ON jobs
WHEN NEW.queue_seq IS NULL AND NEW.status = 'queued'
BEGIN
    UPDATE jobs SET queue_seq = (
        SELECT COALESCE(MAX(queue_seq), 0) + 1 FROM jobs
        WHERE status = 'queued' AND NOT cached AND priority = NEW.priority
    ) WHERE id = NEW.id;
END
"""
PG_BACKFILL = """
UPDATE jobs SET queue_seq = numbered.n
FROM (
    SELECT id, row_number() OVER (PARTITION BY priority ORDER BY created_at, id) AS n
    FROM jobs WHERE status = 'queued'
) AS numbered
WHERE jobs.id = numbered.id
"""
SQLITE_BACKFILL = """
UPDATE jobs SET queue_seq = (
    SELECT COUNT(*) FROM jobs AS earlier
    WHERE earlier.status = 'queued' AND earlier.priority = jobs.priority
      AND (earlier.created_at < jobs.created_at
           OR (earlier.created_at = jobs.created_at AND earlier.id <= jobs.id))
) WHERE status = 'queued'
"""


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue_seq", sa.BigInteger(), nullable=True))
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute(PG_BACKFILL if postgres else SQLITE_BACKFILL)  # queued jobs only: the rest need none
    op.create_index(
        "ix_jobs_queue_lane",
        "jobs",
        ["status", "priority", "queue_seq"],
        unique=False,
        postgresql_where=COMPUTING,
        sqlite_where=COMPUTING,
    )
    if postgres:
        for lane in LANES:
            op.execute(f"CREATE SEQUENCE jobs_queue_seq_{lane}")
            op.execute(
                f"SELECT setval('jobs_queue_seq_{lane}', COALESCE(MAX(queue_seq), 0) + 1, false)"
                f" FROM jobs WHERE priority = '{lane}'"
            )
        op.execute(PG_FUNCTION)
        op.execute(
            "CREATE TRIGGER jobs_queue_seq BEFORE INSERT ON jobs"
            " FOR EACH ROW EXECUTE FUNCTION jobs_queue_seq()"
        )
    else:
        op.execute(SQLITE_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER jobs_queue_seq ON jobs")
        op.execute("DROP FUNCTION jobs_queue_seq()")
        for lane in LANES:
            op.execute(f"DROP SEQUENCE jobs_queue_seq_{lane}")
    else:
        op.execute("DROP TRIGGER jobs_queue_seq")
    op.drop_index("ix_jobs_queue_lane", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("queue_seq")
