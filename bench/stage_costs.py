"""CPU per operation of three pieces of a stage, each next to what it replaced, in the same run.

- the chain's next step: `tasks.continuation.send_next` (a recorded template) against Celery's own
  continuation (the tracer's `_retry_publish(signature.apply_async, ...)`), both publishing to a
  redis-server of the run's own; the client's CPU and redis-server's per message.
- a stage's transitions (`start_text`, then `complete_text` on to the video stage): committed
  alone (`models.db.alone`: one statement in autocommit) against the same in a transaction
  (BEGIN, the statement, COMMIT), on a Postgres cluster of the run's own; the client's CPU and
  the cluster's per transition.
- the `jobs` indexes (migration 0016): a video job's four transitions with this schema's indexes
  against those before 0016 (the migration downgraded and upgraded between turns), on a Postgres
  cluster of the run's own; the client's CPU and the cluster's per job.

Both sides take turns in `--rounds` parts, so a slower minute of a shared machine falls on both.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bench.common import (
    Result,
    cluster_cpu_seconds,
    cpu_seconds,
    machine,
    print_results,
    private_postgres,
    private_redis,
)


class _Request:
    """The parts of a task request the tracer and send_next read."""

    def __init__(self, chain: list[dict[str, Any]], task_id: str) -> None:
        self.chain, self.id, self.root_id, self.callbacks = chain, task_id, task_id, None


class _Task:
    def __init__(self, app: Any, request: _Request) -> None:
        self.app, self.request = app, request


def _turns(
    sides: dict[str, Callable[[int], None]],
    n: int,
    rounds: int,
    server: Callable[[], float],
    before: dict[str, Callable[[], None]] | None = None,
) -> dict[str, tuple[float, float]]:
    """Client and server CPU seconds per operation of each side, the sides taking turns;
    `before[side]`, if any, runs before each of that side's turns, off the clock."""
    totals = {name: [0.0, 0.0] for name in sides}
    part = max(1, n // rounds)
    for _ in range(rounds):
        for name, run in sides.items():
            if before and name in before:
                before[name]()
            c0, s0 = time.process_time(), server()
            run(part)
            totals[name][0] += time.process_time() - c0
            totals[name][1] += server() - s0
    return {name: (c / (part * rounds), s / (part * rounds)) for name, (c, s) in totals.items()}


def continuation(n: int, rounds: int) -> list[Result]:
    from celery import signature

    from models.settings import Settings
    from tasks import continuation as cont
    from tasks.celery_app import create_celery
    from tasks.contract import names, publish

    with private_redis() as (url, redis_proc):
        app = create_celery(Settings(broker_url=url), set_as_current=False)

        class Recorder:
            """A producer that keeps what send_task publishes (the stage message's body)."""

            connection = app.connection_for_write()

            def __init__(self) -> None:
                self.bodies: list[Any] = []

            def publish(self, body: Any, **_kw: Any) -> None:
                self.bodies.append(body)

        def text_requests(k: int) -> list[tuple[str, _Request]]:
            out = []
            for _ in range(k):
                jid, recorder = str(uuid.uuid4()), Recorder()
                publish._send_stages(app, jid, "video", "normal", "text", recorder)  # type: ignore[arg-type]
                chain = json.loads(json.dumps(recorder.bodies[0]))[2]["chain"]  # as a worker decodes it
                out.append((jid, _Request(chain, names.stage_task_id(jid, "text"))))
            return out

        def celery_side(k: int) -> None:
            for _, r in text_requests_cache.pop():
                step = signature(r.chain[-1], app=app)
                app.amqp._retry_publish(
                    step.apply_async, (None,), chain=r.chain[:-1], parent_id=r.id, root_id=r.root_id,
                    priority=None,
                )  # fmt: skip

        def template_side(k: int) -> None:
            for jid, r in text_requests_cache.pop():
                if not cont.send_next(_Task(app, r), jid):  # type: ignore[arg-type]
                    raise RuntimeError("send_next fell back to Celery's path")

        part = max(1, n // rounds)
        # Built before the clock starts: the requests as a text worker gets them.
        text_requests_cache = [text_requests(part) for _ in range(2 * rounds)]
        sides = {"celery": celery_side, "template": template_side}
        costs = _turns(sides, n, rounds, lambda: cpu_seconds([redis_proc]))
    base, new = costs["celery"], costs["template"]
    return [
        Result("continuation", "client CPU per message", 1e6 * new[0], 1e6 * base[0], "us",
               higher_is_better=False),
        Result("continuation", "redis CPU per message", 1e6 * new[1], 1e6 * base[1], "us",
               higher_is_better=False),
    ]  # fmt: skip


def transitions(n: int, rounds: int) -> list[Result]:
    from sqlalchemy import insert

    from models import Job, states
    from models.db import alone, make_engine, make_session_factory, transaction
    from models.keys import ensure_default_tenant

    with private_postgres() as (db_url, postmaster):
        engine = make_engine(db_url, pool_size=1, max_overflow=0)
        sessions = make_session_factory(engine)
        with transaction(sessions) as s:
            ensure_default_tenant(s)

        def jobs(k: int) -> list[uuid.UUID]:
            ids = [uuid.uuid4() for _ in range(k)]
            rows = [
                {"id": i, "status": "queued", "modality": "video", "prompt": "p", "params": {}} for i in ids
            ]
            with engine.begin() as conn:
                conn.execute(insert(Job), rows)
            return ids

        def in_transaction(work: Callable[[Any], Any]) -> Any:
            with transaction(sessions) as s:
                return work(s)

        def side(commit: Callable[[Callable[[Any], Any]], Any]) -> Callable[[int], None]:
            def run(k: int) -> None:
                for jid in ready.pop():
                    commit(lambda s, j=jid: states.start_text(s, j))
                    commit(
                        lambda s, j=jid: states.complete_text(s, j, "a shot", 0.1, final=False, progress=20)
                    )

            return run

        part = max(1, n // rounds)
        ready = [jobs(part) for _ in range(2 * rounds)]  # inserted before the clock starts
        sides = {"transaction": side(in_transaction), "alone": side(lambda w: alone(sessions, w))}
        costs = _turns(sides, n, rounds, lambda: cluster_cpu_seconds(postmaster))
        engine.dispose()
    base, new = costs["transaction"], costs["alone"]
    # Two transitions per job: per transition.
    return [
        Result("transition", "client CPU", 1e6 * new[0] / 2, 1e6 * base[0] / 2, "us",
               higher_is_better=False),
        Result("transition", "Postgres CPU", 1e6 * new[1] / 2, 1e6 * base[1] / 2, "us",
               higher_is_better=False),
    ]  # fmt: skip


def handover(n: int, rounds: int) -> list[Result]:
    """A video job's four transitions (start, text done, video entered, finished), each alone:
    the `jobs` indexes of migration 0016 against those before it, switched between turns."""
    from sqlalchemy import insert

    from models import Job, Stage, states
    from models.db import alone, make_engine, make_session_factory, transaction
    from models.keys import ensure_default_tenant
    from models.migrate import downgrade, upgrade
    from models.recovery import deadline_in, entry_deadline

    with private_postgres() as (db_url, postmaster):
        engine = make_engine(db_url, pool_size=1, max_overflow=0)
        sessions = make_session_factory(engine)
        with transaction(sessions) as s:
            ensure_default_tenant(s)
        entry = entry_deadline(600, 3)

        def jobs(k: int) -> list[uuid.UUID]:
            ids = [uuid.uuid4() for _ in range(k)]
            rows = [{"id": i, "status": "queued", "modality": "video", "prompt": "p", "params": {"seed": 1}}
                    for i in ids]  # fmt: skip
            with engine.begin() as conn:
                conn.execute(insert(Job), rows)
            return ids

        def go(k: int) -> None:
            for jid in ready.pop():
                alone(sessions, lambda s, j=jid: states.start_text(s, j, deadline_at=entry))
                alone(sessions, lambda s, j=jid: states.complete_text(
                    s, j, "p", 0.1, final=False, progress=20, deadline_at=deadline_in(3600)))  # fmt: skip
                alone(sessions, lambda s, j=jid: states.resume_stage(s, j, Stage.VIDEO, deadline_at=entry))
                alone(sessions, lambda s, j=jid: states.complete_render(s, j, Stage.VIDEO, "k", 10, 0.1, 9))

        part = max(1, n // rounds)
        ready = [jobs(part) for _ in range(2 * rounds)]  # inserted before the clock starts
        # The migration itself, down and up between turns: its downgrade puts the indexes back.
        before = {"0016": lambda: upgrade(db_url, "0016"), "before 0016": lambda: downgrade(db_url, "0015")}
        costs = _turns(
            {"0016": go, "before 0016": go}, n, rounds, lambda: cluster_cpu_seconds(postmaster), before
        )
        engine.dispose()
    base, new = costs["before 0016"], costs["0016"]
    return [
        Result(
            "job's 4 transitions", "client CPU", 1e6 * new[0], 1e6 * base[0], "us", higher_is_better=False
        ),
        Result(
            "job's 4 transitions", "Postgres CPU", 1e6 * new[1], 1e6 * base[1], "us", higher_is_better=False
        ),
    ]


def run(args: argparse.Namespace) -> list[Result]:
    print(f"stage costs: {args.n} operations a side in {args.rounds} turns; {machine()}")
    results = (
        continuation(args.n, args.rounds) + transitions(args.n, args.rounds) + handover(args.n, args.rounds)
    )
    print_results(results)
    return results


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=3000, help="operations (messages, jobs) per side")
    parser.add_argument("--rounds", type=int, default=6, help="turns each side takes")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
