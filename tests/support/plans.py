"""Postgres's plans for captured statements: which scans could read only part of a table."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event


@contextmanager
def statements(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    """The SQL this thread runs on `engine`, with its parameters (other threads' are left out)."""
    seen: list[tuple[str, Any]] = []
    me = threading.get_ident()

    def record(_conn, _cursor, statement, parameters, *_args) -> None:
        if threading.get_ident() == me:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def scans(engine: Engine, statement: str, parameters: Any) -> list[dict[str, Any]]:
    """The scan nodes of Postgres's plan for a captured statement, sequential scans priced out
    (enable_seqscan=off), so a scan left without an index condition has no index to use."""
    with engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")
        [[plan]] = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).all()
        conn.rollback()
    nodes, out = [plan[0]["Plan"]], []
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if node["Node Type"].endswith("Scan") and node["Node Type"] != "Bitmap Heap Scan":
            out.append(node)
    return out


def unindexed(scans: list[dict[str, Any]]) -> list[str]:
    """Scans that read a whole table or index: no Index Cond (a Seq Scan never has one)."""
    return [f"{n['Node Type']} {n.get('Index Name') or n.get('Relation Name')}" for n in scans
            if "Index Cond" not in n]  # fmt: skip
