"""tenant webhooks: webhook_endpoints.tenant_id, webhook_secrets.tenant_id unique with generation

Existing rows move to the default tenant (a job's own endpoint to its job's tenant), so a
deployment upgraded from deployment-wide webhooks keeps its endpoints and its secret.

Revision ID: 0006
Revises: 0004
Create Date: 2026-11-30
"""

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# models.tenant.DEFAULT_TENANT_ID, as in 0004: owns everything that existed before tenants did.
DEFAULT_TENANT_ID = uuid.UUID("00000000-0000-0000-0000-000000000001")

jobs = sa.table("jobs", sa.column("id", sa.Uuid()), sa.column("tenant_id", sa.Uuid()))
endpoints = sa.table(
    "webhook_endpoints",
    sa.column("job_id", sa.Uuid()),
    sa.column("tenant_id", sa.Uuid()),
    sa.column("disabled_at", sa.DateTime(timezone=True)),
    sa.column("disabled_reason", sa.String(64)),
)
secrets = sa.table("webhook_secrets", sa.column("tenant_id", sa.Uuid()))


def upgrade() -> None:
    # Nullable first, filled, then NOT NULL (the pattern of 0004).
    with op.batch_alter_table("webhook_endpoints", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tenant_id", sa.Uuid(), nullable=True))
    with op.batch_alter_table("webhook_secrets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tenant_id", sa.Uuid(), nullable=True))

    job_tenant = sa.select(jobs.c.tenant_id).where(jobs.c.id == endpoints.c.job_id).scalar_subquery()
    op.execute(endpoints.update().where(endpoints.c.job_id.is_not(None)).values(tenant_id=job_tenant))
    op.execute(endpoints.update().where(endpoints.c.tenant_id.is_(None)).values(tenant_id=DEFAULT_TENANT_ID))
    op.execute(secrets.update().values(tenant_id=DEFAULT_TENANT_ID))

    with op.batch_alter_table("webhook_endpoints", schema=None) as batch_op:
        batch_op.alter_column("tenant_id", existing_type=sa.Uuid(), nullable=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_webhook_endpoints_tenant_id_tenants"),
            "tenants",
            ["tenant_id"],
            ["id"],
            ondelete="CASCADE",
        )
        batch_op.create_index("ix_webhook_endpoints_tenant_job", ["tenant_id", "job_id"], unique=False)
    with op.batch_alter_table("webhook_secrets", schema=None) as batch_op:
        batch_op.alter_column("tenant_id", existing_type=sa.Uuid(), nullable=False)
        batch_op.drop_constraint(batch_op.f("uq_webhook_secrets_generation"), type_="unique")
        batch_op.create_unique_constraint("uq_webhook_secrets_tenant_generation", ["tenant_id", "generation"])
        batch_op.create_foreign_key(
            batch_op.f("fk_webhook_secrets_tenant_id_tenants"),
            "tenants",
            ["tenant_id"],
            ["id"],
            ondelete="CASCADE",
        )


def downgrade() -> None:
    # Back to one deployment-wide scope: only the default tenant's secrets can stay (generations
    # must be unique again), and another tenant's registered endpoints would receive every job's
    # events, so they are soft-deleted (their delivery logs stay).
    op.execute(secrets.delete().where(secrets.c.tenant_id != DEFAULT_TENANT_ID))
    op.execute(
        endpoints.update()
        .where(endpoints.c.job_id.is_(None), endpoints.c.tenant_id != DEFAULT_TENANT_ID)
        .values(
            disabled_at=sa.func.coalesce(endpoints.c.disabled_at, sa.func.now()), disabled_reason="deleted"
        )
    )
    with op.batch_alter_table("webhook_secrets", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_webhook_secrets_tenant_id_tenants"), type_="foreignkey")
        batch_op.drop_constraint("uq_webhook_secrets_tenant_generation", type_="unique")
        batch_op.create_unique_constraint(batch_op.f("uq_webhook_secrets_generation"), ["generation"])
        batch_op.drop_column("tenant_id")
    with op.batch_alter_table("webhook_endpoints", schema=None) as batch_op:
        batch_op.drop_index("ix_webhook_endpoints_tenant_job")
        batch_op.drop_constraint(batch_op.f("fk_webhook_endpoints_tenant_id_tenants"), type_="foreignkey")
        batch_op.drop_column("tenant_id")
