"""`genqueue keys ...` and `genqueue tenants ...`: API keys and per-tenant plans, straight in the database."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from sqlalchemy.orm import Session

from models import Tenant
from models.db import make_engine, make_session_factory, transaction
from models.keys import create_key, get_tenant, list_keys, revoke_key, set_plan
from models.plans import PLAN_FIELDS, Plan
from models.settings import Settings


@contextmanager
def _session() -> Iterator[Session]:
    engine = make_engine(Settings().database_url, pool_size=1, max_overflow=0)
    try:
        with transaction(make_session_factory(engine)) as s:
            yield s
    finally:
        engine.dispose()


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


@click.group()
def keys() -> None:
    """Create, list and revoke API keys."""


@keys.command("create")
@click.option("--tenant", required=True, help="Tenant name; created (with the default plan) if new.")
@click.option("--label", default=None, help="A note to recognise the key by, e.g. 'ci'.")
def keys_create(tenant: str, label: str | None) -> None:
    """Create a key and print it. It is shown this once: only its hash is stored."""
    try:
        with _session() as s:
            row, key = create_key(s, tenant, label)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tenant") from None
    click.echo(f"Created key {row.prefix} for tenant {tenant!r}; it is not shown again:", err=True)
    click.echo(key)


@keys.command("list")
@click.option("--tenant", default=None, help="Only this tenant's keys.")
def keys_list(tenant: str | None) -> None:
    """List keys by prefix (never the keys themselves)."""
    with _session() as s:
        rows = list_keys(s, tenant)
    click.echo(f"{'PREFIX':<10} {'TENANT':<24} {'CREATED':<21} {'REVOKED':<21} LABEL")
    for k in rows:
        created, revoked = _when(k.created_at), _when(k.revoked_at)
        click.echo(f"{k.prefix:<10} {k.tenant:<24} {created:<21} {revoked:<21} {k.label or ''}")


@keys.command("revoke")
@click.argument("prefix")
def keys_revoke(prefix: str) -> None:
    """Revoke the key with this prefix; requests with it get 401 from then on."""
    with _session() as s:
        done = revoke_key(s, prefix)
    if not done:
        raise click.ClickException(f"no active key with prefix {prefix!r}")
    click.echo(f"revoked {prefix}")


@click.group()
def tenants() -> None:
    """Tenants and their plans (limits on what their jobs may ask for)."""


def _show(tenant: Tenant) -> None:
    plan = dataclasses.asdict(Plan.effective(Settings(), tenant.plan))
    click.echo(json.dumps({"tenant": tenant.name, "overrides": tenant.plan, "plan": plan}, indent=2))


@tenants.command("list")
def tenants_list() -> None:
    """Every tenant with its plan overrides."""
    from sqlalchemy import select

    with _session() as s:
        for t in s.scalars(select(Tenant).order_by(Tenant.name)):
            click.echo(f"{t.name:<24} {json.dumps(t.plan or {})}")


def _plan_options(fn: Any) -> Any:
    for name in reversed(list(PLAN_FIELDS)):
        if name == "max_priority":
            option = click.option("--max-priority", type=click.Choice(["low", "normal", "high"]))
        elif name == "rate_limit":
            option = click.option("--rate-limit", help="Per key, e.g. '10/second;300/minute'.")
        elif name == "allowed_models":
            option = click.option("--allowed-models", help="Model ids, e.g. 'echo,video:wan-tiny'; '': all.")
        else:
            option = click.option(f"--{name.replace('_', '-')}", type=click.IntRange(min=0))
        fn = option(fn)
    return fn


@tenants.command("plan")
@click.argument("name")
@_plan_options
@click.option("--unset", multiple=True, type=click.Choice(list(PLAN_FIELDS)), help="Back to the default.")
@click.option("--reset", is_flag=True, help="Drop every override first.")
def tenants_plan(name: str, unset: tuple[str, ...], reset: bool, **limits: Any) -> None:
    """Show a tenant's plan, or set limits on it (created if new); unset ones follow the defaults."""
    changes = {k: v for k, v in limits.items() if v is not None}
    with _session() as s:
        if not (changes or unset or reset):
            tenant = get_tenant(s, name)
            if tenant is None:
                raise click.ClickException(f"no tenant {name!r}")
        else:
            try:
                tenant = set_plan(s, name, changes, unset=unset, reset=reset)
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
        _show(tenant)
