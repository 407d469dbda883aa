"""result cache columns and the queue-position index

Revision ID: 0005
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cache_key", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("cached", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column("source_job_id", sa.Uuid(), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_jobs_source_job_id_jobs"), "jobs", ["source_job_id"], ["id"], ondelete="SET NULL"
        )
        batch_op.create_index(batch_op.f("ix_jobs_cache_key"), ["cache_key"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_source_job_id"), ["source_job_id"], unique=False)
        batch_op.create_index(
            "ix_jobs_status_priority_created", ["status", "priority", "created_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_status_priority_created")
        batch_op.drop_index(batch_op.f("ix_jobs_source_job_id"))
        batch_op.drop_index(batch_op.f("ix_jobs_cache_key"))
        batch_op.drop_constraint(batch_op.f("fk_jobs_source_job_id_jobs"), type_="foreignkey")
        batch_op.drop_column("source_job_id")
        batch_op.drop_column("cached")
        batch_op.drop_column("cache_key")
