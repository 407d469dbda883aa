"""retention: jobs.data_removed_at and the retention task's partial index

Nullable, no default and no backfill: every existing job keeps its data until the retention
task (or a DELETE) removes it.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("data_removed_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_jobs_retention",
        "jobs",
        ["completed_at"],
        unique=False,
        postgresql_where=sa.text("data_removed_at IS NULL AND completed_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_retention", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("data_removed_at")
