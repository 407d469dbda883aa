"""jobs: fillfactor 50, so the updates a job row goes through stay on its page

A new job's row is updated within about 50 ms of its INSERT (published_at, app.published) and
then at each transition. In full pages each update wrote its new version to another page and
an entry in each of the table's twelve indexes; with half of each new page left free, the
published mark is a heap-only (HOT) update that touches no index: 5000 marks in 22-40 ms
instead of 50-230 ms (docs/BENCHMARKS.md). Existing pages keep their layout until rewritten.
Postgres only: SQLite has no fillfactor.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jobs SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE jobs RESET (fillfactor)")
