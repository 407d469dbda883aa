"""the shot cache: job_shots.cache_key and job_shots.source_job_id

A storyboard's shot identical to one its tenant already rendered copies that shot's file
(models.shot_cache): cache_key finds it, source_job_id says which job it came from. Older
shots have neither and are never a hit.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_shots", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cache_key", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("source_job_id", sa.Uuid(), nullable=True))
        batch_op.create_index(batch_op.f("ix_job_shots_cache_key"), ["cache_key"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_shots", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_shots_cache_key"))
        batch_op.drop_column("source_job_id")
        batch_op.drop_column("cache_key")
