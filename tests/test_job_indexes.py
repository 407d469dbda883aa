"""The jobs table's indexes: the handover between stages writes no index entry, and each reader
of the dropped or narrowed indexes still reads through one (migration 0016)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import insert, text

from app.admission import Admission
from app.quota import _finished
from models import Job, Stage, states
from models.base import utcnow
from models.db import transaction
from models.monitoring import active_jobs
from models.recovery import deadline_in, entry_deadline
from models.tenant import DEFAULT_TENANT_ID
from tasks.celery_app import create_celery
from tasks.maintenance import reap
from tasks.runtime import runtime
from tests.support import plans
from tests.support.jobs import create_job

ENTRY = entry_deadline(600, 3)


def _updates(s: Any) -> tuple[int, int]:
    """This transaction's updates of jobs rows so far: all of them, and the heap-only ones."""
    row = s.execute(
        text(
            "SELECT pg_stat_get_xact_tuples_updated('jobs'::regclass),"
            " pg_stat_get_xact_tuples_hot_updated('jobs'::regclass)"
        )
    ).one()
    return int(row[0]), int(row[1])


def test_the_handover_between_stages_writes_no_index_entry(sessions) -> None:
    jid = create_job(sessions, "video")
    with transaction(sessions) as s:
        assert states.start_text(s, jid, deadline_at=ENTRY) is not None
        # The start changes the status, which is indexed: a new entry in each index. The counters
        # tell the two kinds apart.
        assert _updates(s) == (1, 0)
        assert states.complete_text(
            s, jid, "a shot", 0.1, final=False, progress=20, deadline_at=deadline_in(3600)
        )
        assert states.resume_stage(s, jid, Stage.VIDEO, deadline_at=ENTRY) is not None
        # The text stage's end and the video stage's entry change no indexed column: heap-only.
        assert _updates(s) == (3, 2)
        assert states.complete_render(s, jid, Stage.VIDEO, "k", 10, 0.1, 9)
        assert _updates(s) == (4, 2)


def _backlog(sessions, n: int) -> None:
    """n jobs of each kind the readers look for, none of them due: queued, waiting for or in
    each stage, finished (some with a variant pending)."""
    now = utcnow()
    common = {"tenant_id": DEFAULT_TENANT_ID, "prompt": "p", "params": {}, "metadata": {}, "progress": 0,
              "attempts": 1, "created_at": now, "updated_at": now}  # fmt: skip
    kinds: list[dict[str, Any]] = [
        {"status": "queued", "modality": "text", "published_at": now},
        {
            "status": "running",
            "stage": "text",
            "modality": "video",
            "deadline_at": now + timedelta(minutes=1),
        },
        {
            "status": "running",
            "stage": "video",
            "modality": "video",
            "deadline_at": now + timedelta(minutes=1),
        },
        {"status": "succeeded", "modality": "video", "completed_at": now, "compensated_at": None},
        {"status": "failed", "modality": "video", "completed_at": now, "compensated_at": now},
        {
            "status": "succeeded",
            "modality": "video",
            "completed_at": now,
            "variants": {"gif": {"status": "pending"}},
        },
    ]
    rows = [{"id": uuid.uuid4(), **common, **kind} for kind in kinds for _ in range(n)]
    with sessions.begin() as s:
        s.execute(insert(Job), rows)


def test_the_readers_of_the_dropped_indexes_still_read_through_one(
    settings, sessions, engine, broker
) -> None:
    _backlog(sessions, 300)
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE jobs")  # plans as for a real backlog, not an empty table
    app = create_celery(settings, set_as_current=False)
    rt = runtime(app)
    with plans.statements(rt.engine) as seen:
        assert reap(rt, app) == {}  # nothing is due: only the reads
    gate = Admission(settings.model_copy(update={"admission_max_wait_s": 60.0}), sessions)
    with plans.statements(engine) as counted, sessions() as s:
        assert active_jobs(s)[("running", "video")] == 600  # monitoring
        s.execute(_finished(), {"since": utcnow() - timedelta(minutes=1), "tenant": DEFAULT_TENANT_ID}).all()
        backlog = gate.backlog()  # admission: the active jobs and the finished per second
        assert (backlog.video, backlog.text) == (600, 300) and backlog.finished_per_s
    reads = [
        (sql, p) for sql, p in seen + counted if sql.lstrip().upper().startswith("SELECT") and " jobs" in sql
    ]
    assert len(reads) >= 8, [sql for sql, _ in reads]  # the reaper's rules, the counts
    for sql, parameters in reads:
        assert plans.unindexed(plans.scans(engine, sql, parameters)) == [], sql
    # Admission's finished-per-minute has no other index to fall back on: the partial one serves it.
    [(sql, parameters)] = [
        (sql, p) for sql, p in counted if "completed_at >=" in sql and "tenant_id" not in sql
    ]
    assert [n.get("Index Name") for n in plans.scans(engine, sql, parameters)] == ["ix_jobs_finished_at"], sql
