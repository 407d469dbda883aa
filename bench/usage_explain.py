"""The usage query's plan and time at scale: N jobs over 60 days, a quarter of them one tenant's.

    PYTHONPATH=$PWD python bench/usage_explain.py [--jobs 100000]

Builds a scratch Postgres database (dropped afterwards), fills it with one INSERT ... SELECT,
then prints EXPLAIN (ANALYZE, BUFFERS) of GET /v1/usage's statements for a 30-day window.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine, event, text

from models.db import make_engine, make_session_factory
from models.migrate import upgrade
from models.usage import GroupBy, usage

PG_ADMIN = os.environ.get("GENQUEUE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
TENANTS = 4

FILL = """
INSERT INTO tenants (id, name, plan, created_at)
SELECT ('00000000-0000-0000-0000-0000000000' || lpad(t::text, 2, '0'))::uuid, 'bench-' || t, '{}', now()
FROM generate_series(10, 9 + :tenants) t;
INSERT INTO jobs (id, tenant_id, status, modality, prompt, params, priority, progress, metadata,
                  attempts, recoveries, cached, created_at, updated_at, text_gpu_s, video_gpu_s,
                  text_model, video_model, tokens_generated, frames_rendered)
SELECT gen_random_uuid(),
       ('00000000-0000-0000-0000-0000000000' || lpad((10 + i % :tenants)::text, 2, '0'))::uuid,
       (ARRAY['succeeded','succeeded','succeeded','failed','canceled'])[1 + i % 5],
       CASE WHEN i % 3 = 0 THEN 'video' ELSE 'text' END, 'p', '{}', 'normal', 100, '{}', 1, 0,
       i % 7 = 0, now() - (i % 86400 * 60) * interval '1 second', now(),
       0.5, CASE WHEN i % 3 = 0 THEN 4.0 END, 'smollm2', CASE WHEN i % 3 = 0 THEN 'wan-tiny' END,
       64, CASE WHEN i % 3 = 0 THEN 17 END
FROM generate_series(1, :jobs) i;
ANALYZE jobs;
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    args = parser.parse_args()
    name = f"gq_usage_bench_{uuid.uuid4().hex[:6]}"
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    upgrade(url)
    engine = make_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            for stmt in filter(str.strip, FILL.split(";")):
                conn.execute(text(stmt), {"tenants": TENANTS, "jobs": args.jobs})
        tenant = uuid.UUID("00000000-0000-0000-0000-000000000010")
        end = datetime.now(UTC)
        start = end - timedelta(days=30)
        captured: list[tuple[str, Any]] = []

        def capture(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
            if statement.lstrip().upper().startswith("SELECT"):
                captured.append((statement, params))

        event.listen(engine, "before_cursor_execute", capture)
        for group_by in (None, GroupBy.DAY, GroupBy.MODALITY, GroupBy.MODEL):
            with make_session_factory(engine)() as session:
                began = time.perf_counter()
                usage(session, tenant, start, end, group_by)
                print(f"usage(group_by={group_by}): {1000 * (time.perf_counter() - began):.1f} ms")
        event.remove(engine, "before_cursor_execute", capture)
        with engine.connect() as conn:
            for statement, params in captured:
                plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, params).scalars()
                print("\n" + " ".join(statement.split())[:160] + " ...")
                print("\n".join(plan))
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    main()
