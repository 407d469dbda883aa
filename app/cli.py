"""The `genqueue` command: demo, serving, migrations, the production stack, supervised workers, Flower,
the metrics exporter; the API client's `run` and `jobs` (app.client_cli)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click

from app.client_cli import jobs, run
from app.keys_cli import keys, tenants
from app.models_cli import models
from app.usage_cli import usage
from models import logs
from models.settings import Settings

DEFAULT_DATA_DIR = Path("var/embedded")
DEV_COMMANDS = frozenset({"demo", "serve", "run", "jobs"})  # text logs unless GENQUEUE_LOG_FORMAT says so


def _offline() -> None:
    # Nothing this command runs may reach a model hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """Genqueue: run text, video and image generation jobs at high concurrency."""
    settings = Settings()
    explicit = settings.model_fields_set
    # Production processes (the Procfile) log JSON; the commands a person watches in a terminal
    # default to text. GENQUEUE_LOG_FORMAT / GENQUEUE_LOG_LEVEL, when set, win.
    fmt = (
        settings.log_format
        if "log_format" in explicit or ctx.invoked_subcommand not in DEV_COMMANDS
        else "text"
    )
    level = settings.log_level if "log_level" in explicit else ("INFO" if verbose else "WARNING")
    logs.configure(fmt, level)


class _Loading:
    """The demo's own model-loading indicator (the libraries' bars are off: library_logs): one
    step per model, with the time so far; one line per model when stderr is not a terminal."""

    def __init__(self, kinds: list[str]) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=len(kinds),
            desc=f"Loading models ({', '.join(kinds)})",
            disable=not sys.stderr.isatty(),
            bar_format="{desc}: {n}/{total} [{elapsed}]{postfix}",
        )
        if self.bar.disable:
            click.echo(f"Loading models ({', '.join(kinds)})...", err=True)

    def loaded(self, what: str) -> None:
        self.bar.set_postfix_str(what, refresh=False)
        self.bar.update(1)
        if self.bar.disable:
            click.echo(f"  loaded {what}", err=True)

    def close(self) -> None:
        self.bar.close()


def _wait(client: Any, location: str, poll_s: float = 0.1) -> dict[str, Any]:
    """Poll the job until it finishes, drawing a progress bar on a terminal."""
    from tqdm import tqdm

    last = ""
    with tqdm(total=100, unit="%", disable=not sys.stderr.isatty(), bar_format="{l_bar}{bar}| {n}%") as bar:
        while True:
            job: dict[str, Any] = client.get(location).get_json()
            label = f"{job['status']}{'/' + job['stage'] if job.get('stage') else ''}"
            bar.set_description(label)
            bar.update(job["progress"] - bar.n)
            if bar.disable and label != last:  # not a terminal: one line per state change
                click.echo(f"  {label} {job['progress']}%", err=True)
                last = label
            if job["status"] in ("succeeded", "failed", "canceled"):
                return job
            time.sleep(poll_s)


@main.command()
@click.argument("prompt")
@click.option(
    "--modality",
    type=click.Choice(["video", "text", "image", "storyboard"]),
    default="video",
    show_default=True,
)
@click.option("--data-dir", type=click.Path(path_type=Path), default=DEFAULT_DATA_DIR, show_default=True)
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Job params, e.g. num_frames=17.")
def demo(prompt: str, modality: str, data_dir: Path, params: tuple[str, ...]) -> None:
    """Run one job end to end in this process (SQLite, in-process broker, real models)."""
    _offline()
    from app import create_app
    from tasks.embedded import embedded_dev_key, embedded_settings, embedded_worker, preload_kinds

    # Load only the models this job runs (the text stage always runs).
    preload = {"text": "text", "storyboard": "text,video"}.get(modality, f"text,{modality}")
    settings = embedded_settings(data_dir, worker_preload=preload)
    job_params = {
        k: json.loads(v) if v[:1].isdigit() or v in ("true", "false") else v
        for k, v in (p.split("=", 1) for p in params)
    }
    loading = _Loading(preload_kinds(settings))
    with embedded_worker(settings, on_loaded=loading.loaded):
        loading.close()
        client = create_app(settings).test_client()
        client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {embedded_dev_key(settings)}"
        resp = client.post("/v1/jobs", json={"prompt": prompt, "modality": modality, "params": job_params})
        if resp.status_code != 202:
            raise click.ClickException(f"job rejected ({resp.status_code}): {resp.get_data(as_text=True)}")
        job = resp.get_json()
        click.echo(f"Job {job['id']} queued", err=True)
        job = _wait(client, resp.headers["Location"])
    if job["status"] != "succeeded":
        err = job.get("error") or {}
        raise click.ClickException(f"job {job['status']}: {err.get('code')}: {err.get('message')}")
    click.echo(f"Text: {job['outputs']['text']}")
    from tasks.contract.names import (
        CONTACT_SHEET_NAME,
        VIDEO_NAME,
        artifact_key,
        image_name,
        job_dir,
        shot_name,
    )

    if modality == "video":
        files = [("Video", VIDEO_NAME)]
    elif modality == "storyboard":  # the film, its contact sheet and each shot's clip
        shots = (job.get("storyboard") or {}).get("shots") or []
        files = [("Film", VIDEO_NAME), ("Contact sheet", CONTACT_SHEET_NAME)]
        files += [(f"Shot {s['index']}", shot_name(s["index"])) for s in shots]
    else:  # an image job's PNGs; a text job has no files
        files = [("Image", image_name(index)) for index in range(len(job["outputs"].get("images") or []))]
    for label, name in files:
        if settings.storage_backend == "s3":
            key = artifact_key(job["id"], name)
            click.echo(f"{label}: s3://{settings.storage_s3_bucket}/{settings.storage_s3_prefix}{key}")
        else:
            click.echo(f"{label}: {(job_dir(settings.artifact_dir, job['id']) / name).resolve()}")


@main.command()
@click.option("--embedded", is_flag=True, help="SQLite + in-process broker and worker; no services needed.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--data-dir", type=click.Path(path_type=Path), default=DEFAULT_DATA_DIR, show_default=True)
def serve(embedded: bool, host: str, port: int, data_dir: Path) -> None:
    """Serve the HTTP API (development server; production uses gunicorn, see the Procfile)."""
    _offline()
    from app import create_app

    if not embedded:
        create_app(Settings()).run(host=host, port=port, threaded=True)
        return
    from tasks.embedded import embedded_dev_key, embedded_settings, embedded_worker

    settings = embedded_settings(data_dir)
    click.echo("Loading models...", err=True)
    with embedded_worker(settings):
        click.echo(
            f"Genqueue (embedded) on http://{host}:{port}  data in {settings.artifact_dir.parent}", err=True
        )
        click.echo(f"Development API key (Authorization: Bearer ...): {embedded_dev_key(settings)}", err=True)
        create_app(settings).run(host=host, port=port, threaded=True, use_reloader=False)


@main.command()
def migrate() -> None:
    """Create the database if needed and upgrade its schema to the latest revision."""
    from models.migrate import upgrade

    upgrade(Settings().database_url)
    click.echo("database at head")


@main.command()
@click.option("--timeout", default=2.0, show_default=True)
def workers(timeout: float) -> None:
    """List the live workers and the queues each consumes; exit 1 if there are none."""
    from tasks.celery_app import create_celery

    queues = create_celery(Settings()).control.inspect(timeout=timeout).active_queues() or {}
    for name, qs in sorted(queues.items()):
        click.echo(f"{name}: {', '.join(q['name'] for q in qs)}")
    if not queues:
        raise click.ClickException("no worker answered")


@main.command()
@click.option("--host", default="0.0.0.0", show_default=True)
@click.option("--port", default=9808, show_default=True, type=int)
def exporter(host: str, port: int) -> None:
    """Serve /metrics: queue depths from the broker, jobs and webhook backlog from the database.

    SIGTERM/SIGINT stop it. The metrics are listed in docs/OPERATIONS.md.
    """
    import signal
    import threading

    from app.exporter import serve

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(Settings(), host, port, stop)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--max-restarts", type=int, default=None, help="Give up after N restarts (default: never).")
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(max_restarts: int | None, celery_args: tuple[str, ...]) -> None:
    """Run `celery -A tasks.worker worker CELERY_ARGS`, restarting it if it exits unexpectedly.

    SIGTERM/SIGINT/SIGQUIT are passed on and stop it for good; see app/supervise.py. A worker
    killed outright has the Redis messages it held put back at once (tasks/held_messages.py).
    """
    from app.supervise import celery_worker_command, supervise, worker_environment
    from tasks import held_messages

    settings = Settings()
    status = supervise(
        celery_worker_command(celery_args, quiet=settings.log_format == "json"),
        env=worker_environment(settings),
        backoff_s=settings.worker_restart_backoff_s,
        backoff_max_s=settings.worker_restart_backoff_max_s,
        max_restarts=max_restarts,
        on_exit=functools.partial(held_messages.after_exit, settings),
    )
    sys.exit(status)


@main.command()
@click.option(
    "--procfile",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default="Procfile",
    show_default=True,
)
@click.argument("names", nargs=-1, metavar="[PROCESS]...")
def start(procfile: Path, names: tuple[str, ...]) -> None:
    """Run the Procfile's `release` (migrations), then every other process, supervised.

    With PROCESS names, only those (`release` only when named), e.g. `worker_video` on a GPU
    machine. A crashed process is restarted, one that exits 0 stays down; SIGTERM/SIGINT stop
    all of them gracefully (GENQUEUE_STOP_TIMEOUT_S). See app/stack.py.
    """
    from app.flower_auth import FlowerAuthError, flower_environment
    from app.stack import RELEASE, Stack, read_procfile, stack_environment

    settings = Settings()
    processes = read_procfile(procfile)
    if names:
        unknown = sorted(set(names) - processes.keys())
        if unknown:
            raise click.ClickException(f"not in {procfile}: {', '.join(unknown)}")
        processes = {name: cmd for name, cmd in processes.items() if name in names}
    if "flower" in processes:  # refuse before migrating rather than restart a refusing Flower
        try:
            flower_environment(settings, os.environ)
        except FlowerAuthError as exc:
            raise click.ClickException(str(exc)) from exc
    env = stack_environment(os.environ)
    root = procfile.resolve().parent
    release = processes.pop(RELEASE, None)
    if release is not None:
        click.echo(f"release: {release}", err=True)
        done = subprocess.run(["/bin/sh", "-c", release], cwd=root, env=env, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise click.ClickException(f"release ({release}) failed with status {done.returncode}")
    (root / "var").mkdir(exist_ok=True)  # the beat schedule's directory
    stack = Stack(
        processes,
        env=env,
        cwd=root,
        out=sys.stdout,
        stop_timeout_s=settings.stop_timeout_s,
        backoff_s=settings.worker_restart_backoff_s,
        backoff_max_s=settings.worker_restart_backoff_max_s,
    )
    sys.exit(stack.run())


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("flower_args", nargs=-1, type=click.UNPROCESSED)
def flower(flower_args: tuple[str, ...]) -> None:
    """Run `celery -A tasks.worker flower FLOWER_ARGS` with the authentication Settings decide.

    Basic auth (GENQUEUE_FLOWER_BASIC_AUTH) or, for development, no auth on 127.0.0.1
    (GENQUEUE_FLOWER_UNAUTHENTICATED=true); neither: it refuses to start. See app/flower_auth.py.
    """
    from app.flower_auth import FlowerAuthError, flower_environment

    try:
        env = flower_environment(Settings(), os.environ, flower_args)
    except FlowerAuthError as exc:
        raise click.ClickException(str(exc)) from exc
    # exec: Flower is this process (signals, status); its credentials stay out of argv.
    cmd = [sys.executable, "-m", "celery", "-A", "tasks.worker", "flower", *flower_args]
    os.execve(sys.executable, cmd, env)


main.add_command(keys)
main.add_command(tenants)
main.add_command(usage)
main.add_command(models)
main.add_command(run)  # the client commands (genqueue_client only)
main.add_command(jobs)

if __name__ == "__main__":
    main()
