"""jobs: no index on deadline_at, so the mid-pipeline transitions are heap-only updates

A job's row changes at each stage transition. An update that changes no indexed column and
finds room on its page (migration 0015's fillfactor) is heap-only (HOT): no entry in any of the
table's indexes. The text stage's completion and the next stage's entry change only the stage,
the progress, the attempts, the timings and the deadline among what is indexed, and the
deadline was indexed (ix_jobs_status_deadline) for the reaper alone: every such transition wrote
a new entry in each of the table's twelve indexes. Without it they write none; the reaper finds
the running jobs by status (ix_jobs_status_created) and their deadlines in the rows, once per
reaper_interval_s, over the running jobs only (bounded, with the queued ones, by admission).

Two indexes fewer entries on the transitions that do change status (the start, the finish):
ix_jobs_status_priority_created went unused once ix_jobs_queue_lane (0011) and the status index
serve its readers (the lost-message suspects, the monitoring counts), and ix_jobs_completed_at
gives way to ix_jobs_finished_at, which holds only finished jobs (its readers ask for a
completed_at after some time, which a null never is). On Postgres the indexes are built and
dropped concurrently: the table stays open for reads and writes throughout. Measured in
docs/BENCHMARKS.md.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FINISHED = sa.text("completed_at IS NOT NULL")
DROPPED = ("ix_jobs_status_deadline", "ix_jobs_status_priority_created", "ix_jobs_completed_at")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        with op.batch_alter_table("jobs", schema=None) as batch_op:
            for name in DROPPED:
                batch_op.drop_index(name)
        op.create_index("ix_jobs_finished_at", "jobs", ["completed_at"], sqlite_where=FINISHED)
        return
    # Concurrently, outside a transaction: a plain build of the new index would block writes to
    # the jobs table for as long as it reads it, and a plain DROP INDEX takes an exclusive lock
    # (no reads either) until its transaction ends. The new index is built under a name of its
    # own first, so admission's and the quota's reads always have one.
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_jobs_finished_at")  # an earlier try's, invalid
        op.create_index(
            "ix_jobs_finished_at",
            "jobs",
            ["completed_at"],
            postgresql_where=FINISHED,
            postgresql_concurrently=True,
        )
        for name in DROPPED:
            op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


def downgrade() -> None:
    op.drop_index("ix_jobs_finished_at", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_completed_at", ["completed_at"], unique=False)
        batch_op.create_index(
            "ix_jobs_status_priority_created", ["status", "priority", "created_at"], unique=False
        )
        batch_op.create_index("ix_jobs_status_deadline", ["status", "deadline_at"], unique=False)
