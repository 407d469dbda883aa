"""usage columns: GPU seconds per stage over every attempt, the models that ran, tokens, frames

Nullable, no default and no backfill: adding them rewrites nothing, and jobs finished before
this revision report no usage (there is nothing recorded to compute it from).
The usage query reads a tenant's jobs by creation time through ix_jobs_tenant_created (0004).

Revision ID: 0007
Revises: 0005
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = (
    ("text_gpu_s", sa.Float()),
    ("video_gpu_s", sa.Float()),
    ("text_model", sa.String(length=255)),
    ("video_model", sa.String(length=255)),
    ("tokens_generated", sa.Integer()),
    ("frames_rendered", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for name, type_ in COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for name, _ in reversed(COLUMNS):
            batch_op.drop_column(name)
