"""`genqueue usage --tenant NAME`: a tenant's usage for operators, as JSON or a table."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from models.db import make_engine, make_session_factory, transaction
from models.keys import get_tenant
from models.settings import Settings
from models.usage import GroupBy, WindowError, parse_time, usage_resource, window

_COLUMNS = (
    "JOBS", "SUCCEEDED", "FAILED", "CANCELED", "ACTIVE", "GPU_TEXT_S", "GPU_VIDEO_S", "GPU_IMAGE_S", "TOKENS",
    "FRAMES", "IMAGES", "CACHE_HITS",
)  # fmt: skip


class _Time(click.ParamType[datetime, Any]):
    name = "ISO8601"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            return parse_time(str(value))
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 date-time, e.g. 2026-12-01T00:00:00Z", param, ctx)


def _cells(row: dict[str, Any]) -> list[str]:
    jobs, gpu = row["jobs"], row["gpu_s"]
    active = jobs["queued"] + jobs["running"]
    values = [jobs["total"], jobs["succeeded"], jobs["failed"], jobs["canceled"], active]
    return (
        [str(v) for v in values]
        + [f"{gpu['text']:.3f}", f"{gpu['video']:.3f}", f"{gpu['image']:.3f}"]
        + [str(row[k]) for k in ("tokens", "frames", "images", "cache_hits")]
    )


def table(report: dict[str, Any]) -> str:
    """The report as aligned columns: one line per group, then the total."""
    rows = [[g["key"], *_cells(g)] for g in report["groups"]] + [["TOTAL", *_cells(report["total"])]]
    header = ["KEY", *_COLUMNS]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"usage {report['from']} .. {report['to']}"]
    for r in [header, *rows]:
        cells = (c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        lines.append("  ".join(cells))
    return "\n".join(lines)


@click.command("usage")
@click.option("--tenant", required=True, help="Tenant name.")
@click.option("--from", "start", type=_Time(), help="Window start, ISO 8601 (default: to - 30 days).")
@click.option("--to", "end", type=_Time(), help="Window end, exclusive, ISO 8601 (default: now).")
@click.option("--group-by", type=click.Choice([g.value for g in GroupBy]), default=None)
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="json", show_default=True)
def usage(tenant: str, start: datetime | None, end: datetime | None, group_by: str | None, fmt: str) -> None:
    """A tenant's usage: jobs by outcome, GPU seconds, tokens, frames and cache hits (GET /v1/usage's)."""
    try:
        since, until = window(start, end)
    except WindowError as exc:
        raise click.BadParameter(exc.message, param_hint=f"--{exc.field}") from None
    engine = make_engine(Settings().database_url, pool_size=1, max_overflow=0)
    try:
        with transaction(make_session_factory(engine)) as s:
            row = get_tenant(s, tenant)
            if row is None:
                raise click.ClickException(f"no tenant {tenant!r}")
            tenant_id = row.id
        with transaction(make_session_factory(engine)) as s:  # fresh: usage() sets its snapshot
            report = usage_resource(s, tenant_id, since, until, GroupBy(group_by) if group_by else None)
    finally:
        engine.dispose()
    click.echo(json.dumps({"tenant": tenant, **report}, indent=2) if fmt == "json" else table(report))
