"""queue_position from enqueue numbers (app.queue): right after submits, after a worker takes jobs,
after cancels; and the lane arithmetic on its own."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert

from app.queue import Lane, QueueCounts
from models import Job, states
from models.base import utcnow
from models.db import transaction
from tests.support.api import submit


@pytest.fixture
def fresh(make_app):
    """A client whose process re-reads the lanes on every request (TTL 0): exact figures."""
    return make_app(queue_position_ttl_s=0).test_client()


def _positions(client, ids: list[str]) -> list[int | None]:
    return [client.get(f"/v1/jobs/{i}").get_json()["queue_position"] for i in ids]


def _submit(client, n: int, priority: str) -> list[str]:
    return [submit(client, priority=priority).get_json()["id"] for _ in range(n)]


def test_positions_right_after_submits_follow_priority_then_order(fresh) -> None:
    normal = _submit(fresh, 3, "normal")
    low = _submit(fresh, 2, "low")
    high = _submit(fresh, 2, "high")
    assert _positions(fresh, high + normal + low) == [1, 2, 3, 4, 5, 6, 7]
    listed = {j["id"]: j["queue_position"] for j in fresh.get("/v1/jobs?status=queued").get_json()["data"]}
    assert [listed[i] for i in high + normal + low] == [1, 2, 3, 4, 5, 6, 7]


def test_positions_move_up_as_a_worker_takes_jobs(fresh, sessions) -> None:
    normal = _submit(fresh, 4, "normal")
    high = _submit(fresh, 1, "high")
    with transaction(sessions) as s:  # what a worker's first stage does on entry, in queue order
        for jid in (high[0], normal[0]):
            assert states.start_text(s, uuid.UUID(jid))
    assert _positions(fresh, high + normal) == [None, None, 1, 2, 3]
    assert submit(fresh, priority="high").get_json()["queue_position"] == 1
    assert _positions(fresh, normal[1:]) == [2, 3, 4]


def test_positions_after_cancels(fresh) -> None:
    jobs = _submit(fresh, 6, "normal")
    assert fresh.post(f"/v1/jobs/{jobs[0]}/cancel").status_code == 200  # the head: exact
    assert _positions(fresh, jobs) == [None, 1, 2, 3, 4, 5]
    assert fresh.post(f"/v1/jobs/{jobs[5]}/cancel").status_code == 200  # the tail: exact
    assert _positions(fresh, jobs[1:5]) == [1, 2, 3, 4]
    # From the middle: a gap the lane spreads evenly, so a place is off by at most one gap,
    # in order, and the first and last places stay exact.
    assert fresh.post(f"/v1/jobs/{jobs[2]}/cancel").status_code == 200
    places = _positions(fresh, [jobs[1], jobs[3], jobs[4]])
    assert places[0] == 1 and places[-1] == 3 and places == sorted(places)
    assert all(abs(p - exact) <= 1 for p, exact in zip(places, [1, 2, 3], strict=True))  # type: ignore[operator]


def test_a_backlog_inserted_directly_is_numbered_by_the_database(fresh, sessions) -> None:
    now = utcnow()
    rows = [
        {"id": uuid.uuid4(), "status": "queued", "modality": "text", "prompt": "p", "params": {},
         "priority": "normal", "progress": 0, "metadata": {}, "attempts": 0, "created_at": now,
         "updated_at": now}
        for _ in range(50)
    ]  # fmt: skip
    with sessions.begin() as s:
        s.execute(insert(Job), rows)  # no queue_seq given: the database numbers them
    job = submit(fresh).get_json()
    assert job["queue_position"] == 51
    assert _positions(fresh, [job["id"]]) == [51]


def test_lane_places() -> None:
    lane = Lane(count=5, first=10, last=14)  # numbers 10..14 all queued
    assert [lane.place(s) for s in range(10, 15)] == [1, 2, 3, 4, 5]
    assert lane.place(16) == 7  # submitted since the lane was read: one place per number past the last
    gapped = Lane(count=3, first=10, last=14)  # two of 10..14 left from the middle
    assert [gapped.place(s) for s in (10, 14)] == [1, 3]
    assert 1 <= gapped.place(12) <= 3
    assert Lane(count=2, first=None, last=None).place(7) == 2  # no numbers known: the back
    assert Lane(count=0, first=None, last=None).place(None) == 1


def test_one_lane_reread_at_a_time() -> None:
    """Requests that find the figures due while another request re-reads them use the last ones
    instead of each scanning the backlog too."""
    counts = QueueCounts(ttl_s=60)
    reads: list[object] = []

    class Session:
        def execute(self, _stmt: object) -> list[tuple[str, int, int, int]]:
            reads.append(_stmt)
            if len(reads) == 2:  # a request arriving while this re-read runs
                assert counts.totals(self) == {"normal": Lane(1, 1, 1)}  # type: ignore[arg-type]
            return [("normal", len(reads), 1, len(reads))]

    assert counts.totals(Session()) == {"normal": Lane(1, 1, 1)}  # type: ignore[arg-type]
    counts._at -= 120  # due
    assert counts.totals(Session()) == {"normal": Lane(2, 1, 2)}  # type: ignore[arg-type]
    assert len(reads) == 2
