"""`genqueue models ...`: the model catalog, and hot swaps every web and worker process applies within 1 s."""

from __future__ import annotations

import json

import click

from models import catalog, presence, swaps
from models.cache import spec_version
from models.settings import Settings


def _settings() -> tuple[Settings, swaps.Swaps]:
    settings = Settings()
    return settings, swaps.Swaps(settings.ratelimit_storage_uri)


@click.group("models")
def models() -> None:
    """The models jobs may name (GET /v1/models), and hot swaps of their weights."""


@models.command("list")
def models_list() -> None:
    """Every configured model with the swaps in effect: stage, id, spec, version, default."""
    settings, view = _settings()
    for m in catalog.configured(view.effective(settings)):
        row = {
            "stage": m.stage,
            "id": m.id,
            "spec": m.spec,
            "version": spec_version(m.spec),
            "default": m.default,
        }
        click.echo(json.dumps(row))


@models.command("swap")
@click.argument("stage", type=click.Choice(catalog.stages()))
@click.argument("model_id")
@click.argument("spec")
def models_swap(stage: str, model_id: str, spec: str) -> None:
    """Point MODEL_ID of STAGE at SPEC (a local directory or a module:Class) without a restart.

    Workers load the new weights beside the old at their next job of it, switch, then unload the
    old; a job records the version it ran. Lasts until `genqueue models unswap` (Redis keeps it).
    """
    settings, _ = _settings()
    if catalog.find(settings, stage, model_id) is None:
        raise click.UsageError(f"no {stage} model {model_id!r}; see `genqueue models list`")
    conn = presence.client(settings.ratelimit_storage_uri)
    if conn is None:
        raise click.UsageError("hot swaps need the shared Redis (GENQUEUE_RATELIMIT_URL or a Redis broker)")
    try:
        swaps.swap(conn, stage, model_id, spec)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"{stage}:{model_id} -> {spec} (version {spec_version(spec)})")


@models.command("unswap")
@click.argument("stage", type=click.Choice(catalog.stages()))
@click.argument("model_id")
def models_unswap(stage: str, model_id: str) -> None:
    """Point MODEL_ID back at its configured weights."""
    settings, _ = _settings()
    conn = presence.client(settings.ratelimit_storage_uri)
    removed = conn is not None and swaps.unswap(conn, stage, model_id)
    click.echo(f"{stage}:{model_id} " + ("back to its configured weights" if removed else "was not swapped"))
