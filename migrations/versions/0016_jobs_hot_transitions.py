"""jobs: no index on deadline_at, so the mid-pipeline transitions are heap-only updates

A job's row changes at each stage transition. An update that changes no indexed column and
finds room on its page (migration 0015's fillfactor) is heap-only (HOT): no entry in any of the
table's indexes. The text stage's completion and the next stage's entry change only the stage,
the progress, the attempts, the timings and the deadline among what is indexed, and the
deadline was indexed (ix_jobs_status_deadline) for the reaper alone: every such transition wrote
a new entry in each of the table's twelve indexes. Without it they write none; the reaper finds
the running jobs by status (ix_jobs_status_created) and their deadlines in the rows, once per
reaper_interval_s, over the running jobs only (bounded by the workers' capacity and admission).

Two indexes fewer entries on the transitions that do change status (the start, the finish):
ix_jobs_status_priority_created went unused once ix_jobs_queue_lane (0011) and the status index
serve its readers (the lost-message suspects, the monitoring counts), and ix_jobs_completed_at
keeps only finished jobs (its readers ask for a completed_at at or after some time, which a
null never is). Measured in docs/BENCHMARKS.md.

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


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_status_deadline")
        batch_op.drop_index("ix_jobs_status_priority_created")
        batch_op.drop_index("ix_jobs_completed_at")
    op.create_index(
        "ix_jobs_completed_at", "jobs", ["completed_at"], postgresql_where=FINISHED, sqlite_where=FINISHED
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_completed_at", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_completed_at", ["completed_at"], unique=False)
        batch_op.create_index(
            "ix_jobs_status_priority_created", ["status", "priority", "created_at"], unique=False
        )
        batch_op.create_index("ix_jobs_status_deadline", ["status", "deadline_at"], unique=False)
