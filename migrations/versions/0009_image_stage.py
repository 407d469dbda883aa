"""image stage: jobs.image_s, image_gpu_s, image_model, images_rendered

The image stage's timing, usage and output count, beside the video stage's columns. Nullable,
no backfill: no job ran an image stage before this revision.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("image_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("image_gpu_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("image_model", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("images_rendered", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("images_rendered")
        batch_op.drop_column("image_model")
        batch_op.drop_column("image_gpu_s")
        batch_op.drop_column("image_s")
