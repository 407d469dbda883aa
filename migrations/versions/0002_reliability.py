"""reliability: stage deadlines, recoveries, degraded retries, compensation, idempotency keys

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("recoveries", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("degraded", JSON, nullable=True))
        batch_op.add_column(sa.Column("compensated_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index("ix_jobs_status_deadline", ["status", "deadline_at"], unique=False)

    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_idempotency_keys_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_idempotency_keys")),
    )
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.create_index("ix_idempotency_keys_expires_at", ["expires_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_idempotency_keys_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("idempotency_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_idempotency_keys_job_id"))
        batch_op.drop_index("ix_idempotency_keys_expires_at")
    op.drop_table("idempotency_keys")

    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_status_deadline")
        batch_op.drop_column("compensated_at")
        batch_op.drop_column("degraded")
        batch_op.drop_column("recoveries")
        batch_op.drop_column("deadline_at")
