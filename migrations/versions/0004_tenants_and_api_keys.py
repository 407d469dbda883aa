"""tenants, api keys, jobs.tenant_id

Revision ID: 0004
Revises: 0001
Create Date: 2026-11-30
"""

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# models.tenant.DEFAULT_TENANT_ID: owns the jobs that existed before tenants did.
DEFAULT_TENANT_ID = uuid.UUID("00000000-0000-0000-0000-000000000001")
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    tenants = op.create_table(
        "tenants",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("plan", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("label", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_keys_tenant_id"), ["tenant_id"], unique=False)

    assert tenants is not None
    op.bulk_insert(
        tenants, [{"id": DEFAULT_TENANT_ID, "name": "default", "plan": {}, "created_at": datetime.now(UTC)}]
    )
    # Nullable first, filled, then NOT NULL: existing jobs belong to the default tenant.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tenant_id", sa.Uuid(), nullable=True))
    jobs = sa.table("jobs", sa.column("tenant_id", sa.Uuid()))
    op.execute(jobs.update().values(tenant_id=DEFAULT_TENANT_ID))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.alter_column("tenant_id", existing_type=sa.Uuid(), nullable=False)
        batch_op.create_foreign_key(batch_op.f("fk_jobs_tenant_id_tenants"), "tenants", ["tenant_id"], ["id"])
        batch_op.create_index("ix_jobs_tenant_created", ["tenant_id", "created_at", "id"], unique=False)
        batch_op.create_index("ix_jobs_tenant_status", ["tenant_id", "status"], unique=False)
        batch_op.create_index("ix_jobs_completed_at", ["completed_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_completed_at")
        batch_op.drop_index("ix_jobs_tenant_status")
        batch_op.drop_index("ix_jobs_tenant_created")
        batch_op.drop_constraint(batch_op.f("fk_jobs_tenant_id_tenants"), type_="foreignkey")
        batch_op.drop_column("tenant_id")

    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_keys_tenant_id"))
    op.drop_table("api_keys")
    op.drop_table("tenants")
