"""`genqueue run` and `genqueue jobs ...`: the API's client commands, built on genqueue_client only.

They talk HTTP to a server (--url/--api-key, or the client's environment variables, see
genqueue_client.core) and import nothing of the server's own code, so they behave exactly as a
product backend using the client would.
Exit codes: 0 succeeded (or done), 1 the job failed, 2 usage error, 3 the job was canceled,
4 the API refused the request (problem+json), 5 the server could not be reached, 6 --timeout
passed while waiting (the job goes on), 130 interrupted (Ctrl-C; the job goes on).
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

import genqueue_client as gq
from genqueue_client.core import DEFAULT_URL, KEY_ENV, URL_ENV

EXIT_FAILED, EXIT_USAGE, EXIT_CANCELED, EXIT_API, EXIT_TRANSPORT, EXIT_TIMEOUT = 1, 2, 3, 4, 5, 6
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
EXIT_BY_STATUS = {"succeeded": 0, "failed": EXIT_FAILED, "canceled": EXIT_CANCELED}
# A download's default name per variant (webm, preview, upscale: a video job's output variants).
SUFFIXES = {
    "video": "mp4", "image": "png", "thumbnail": "jpg", "text": "txt",
    "webm": "webm", "preview": "webp", "upscale": "mp4",
}  # fmt: skip
F = TypeVar("F", bound=Callable[..., Any])


def connection(command: F) -> F:
    """--url and --api-key (or their environment variables), handed to the command as `client`."""

    # The client's own variables (not server settings: docs/API.md, not docs/SETTINGS.md).
    @click.option("--url", envvar=URL_ENV, default=DEFAULT_URL, show_default=True,
                  help=f"The server's base URL (env {URL_ENV}).")  # fmt: skip
    @click.option("--api-key", envvar=KEY_ENV, help=f"An API key, gq_... (env {KEY_ENV}).")
    @functools.wraps(command)
    def wrapper(url: str, api_key: str | None, **kwargs: Any) -> Any:
        with answered(), gq.Client(url, api_key) as client:
            return command(client=client, **kwargs)

    return wrapper  # type: ignore[return-value]


@contextmanager
def answered() -> Iterator[None]:
    """The client's failures as one line on stderr and their exit code."""
    try:
        yield
    except gq.APIError as exc:
        click.echo(f"error: {exc} [{exc.slug or exc.type}]", err=True)
        sys.exit(EXIT_API)
    except gq.TransportError as exc:
        click.echo(f"error: cannot reach the server: {exc}", err=True)
        sys.exit(EXIT_TRANSPORT)
    except gq.WaitTimeout as exc:
        click.echo(f"error: {exc} (it goes on; `genqueue jobs get` shows it)", err=True)
        sys.exit(EXIT_TIMEOUT)
    except KeyboardInterrupt:  # not click's "Aborted!" (exit 1, which here means a failed job)
        click.echo("interrupted (a submitted job goes on: `genqueue jobs cancel <id>` stops it)", err=True)
        sys.exit(EXIT_INTERRUPTED)


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)  # 17, 0.5, true
    except ValueError:
        return raw


def _params(pairs: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--param takes KEY=VALUE, not {pair!r}")
        out[key] = _value(raw)
    return out


def _model(values: tuple[str, ...]) -> str | dict[str, str] | None:
    """--model ID (the stage that makes the output) or --model STAGE=ID, repeated per stage."""
    plain = [v for v in values if "=" not in v]
    per_stage = dict(v.split("=", 1) for v in values if "=" in v)
    if len(plain) > 1 or (plain and per_stage) or any(not k or not v for k, v in per_stage.items()):
        raise click.UsageError("--model takes one ID, or STAGE=ID once per stage")
    return plain[0] if plain else per_stage or None


class Progress:
    """A bar per stage (the stage's name, the job's percent), moved by every event; one line
    per stage and the end when stderr is not a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.tty = enabled, sys.stderr.isatty()
        self.stage: str | None = None
        self.bar: Any = None

    def __call__(self, event: gq.Event) -> None:
        if not self.enabled:
            return
        stage = event.stage or self.stage
        if stage != self.stage and stage is not None:
            self._start(stage)
        done = 100 if event.type == "job.succeeded" else event.progress
        if self.bar is not None and done is not None and done > self.bar.n:
            self.bar.update(done - self.bar.n)
        if not self.tty and event.id is not None and event.type != "job.progress":
            click.echo(f"  {event.type}", err=True)

    def _start(self, stage: str) -> None:
        from tqdm import tqdm

        start = self.bar.n if self.bar is not None else 0
        self.close()
        self.stage = stage
        if not self.tty:
            click.echo(f"  stage {stage}", err=True)
            return
        self.bar = tqdm(total=100, initial=start, desc=f"{stage:>5}", unit="%", file=sys.stderr,
                        bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}]")  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _finish(client: gq.Client, job: gq.Job, out: Path | None, as_json: bool) -> None:
    """Report a finished job, write its output, exit with its status's code."""
    if job.status == "succeeded" and out is not None:
        client.download(job.id, out, variant="text" if job.modality == "text" else None)
    if as_json:
        click.echo(json.dumps(job.raw, indent=2))
    elif job.status == "succeeded":
        click.echo(job.text or "")
        if out is not None:
            click.echo(f"wrote {out}", err=True)
    else:
        err = job.error or {}
        click.echo(
            f"job {job.id} {job.status}: {err.get('code', '')} {err.get('message', '')}".rstrip(), err=True
        )
    sys.exit(EXIT_BY_STATUS.get(job.status, EXIT_FAILED))


@click.command()
@click.argument("prompt")
@click.option("--modality", type=click.Choice(["video", "text", "image"]), default="video", show_default=True)
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", help="Job params, e.g. num_frames=17.")
@click.option("--priority", type=click.Choice(["low", "normal", "high"]))
@click.option("--model", "model", multiple=True, metavar="[STAGE=]ID",
              help="The model to run (GET /v1/models): an ID, or STAGE=ID per stage.")  # fmt: skip
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the video (an image job's first PNG, or the text) here.",
)
@click.option("--idempotency-key", help="Default: a new one per run.")
@click.option("--timeout", type=float, help="Give up waiting after this many seconds (exit 6).")
@click.option("--json", "as_json", is_flag=True, help="Print the finished job as JSON.")
@click.option("--progress/--no-progress", default=True, show_default=True)
@connection
def run(
    client: gq.Client,
    prompt: str,
    modality: str,
    params: tuple[str, ...],
    priority: str | None,
    model: tuple[str, ...],
    out: Path | None,
    idempotency_key: str | None,
    timeout: float | None,
    as_json: bool,
    progress: bool,
) -> None:
    """Submit a job to a server, follow it to the end, and write its output (--out)."""
    job = client.submit(
        prompt,
        modality,
        params=_params(params) or None,
        priority=priority,
        model=_model(model),
        idempotency_key=idempotency_key,
    )
    click.echo(f"job {job.id} {job.status}", err=True)
    bar = Progress(progress)
    try:
        job = client.wait(job.id, timeout=timeout, on_event=bar)
    finally:
        bar.close()
    _finish(client, job, out, as_json)


@click.group()
def jobs() -> None:
    """Jobs on a server, over its API: list, get, cancel, delete, download, events."""


@jobs.command("list")
@click.option("--status", help="queued, running, succeeded, failed, canceled (comma-separated).")
@click.option("--limit", type=int, default=20, show_default=True, help="At most this many (0: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@connection
def list_jobs(client: gq.Client, status: str | None, limit: int, as_json: bool) -> None:
    """The newest jobs first, page after page."""
    for n, job in enumerate(client.list(status=status, page_size=min(limit, 100) or 100)):
        if limit and n >= limit:
            break
        if as_json:
            click.echo(json.dumps(job.raw))
        else:
            created = job.raw.get("timings", {}).get("created_at") or ""
            stage = job.stage or "-"
            click.echo(
                f"{job.id}  {job.status:<9} {stage:<5} {job.progress:>3}%  {job.modality:<5} {created}"
            )


@jobs.command("get")
@click.argument("job_id")
@connection
def get_job(client: gq.Client, job_id: str) -> None:
    """The job as JSON."""
    click.echo(json.dumps(client.get(job_id).raw, indent=2))


@jobs.command("cancel")
@click.argument("job_id")
@connection
def cancel_job(client: gq.Client, job_id: str) -> None:
    """Cancel a queued or running job."""
    click.echo(f"job {client.cancel(job_id).id} canceled", err=True)


@jobs.command("delete")
@click.argument("job_id")
@connection
def delete_job(client: gq.Client, job_id: str) -> None:
    """Remove the job's outputs, prompt and files now (canceling it first if active)."""
    client.delete(job_id)
    click.echo(f"job {job_id} deleted", err=True)


@jobs.command("download")
@click.argument("job_id")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Default: <id>.mp4, <id>.png or <id>.txt."
)
@click.option("--variant", type=click.Choice(list(SUFFIXES)), help="image: the first PNG.")
@click.option("--resume/--no-resume", default=True, show_default=True, help="Continue a partial file.")
@connection
def download(client: gq.Client, job_id: str, out: Path | None, variant: str | None, resume: bool) -> None:
    """Write the job's content to a file, continuing a partial one."""
    if out is None:
        kind = variant or client.get(job_id).modality  # the server's default variant is the modality's
        out = Path(f"{job_id}.{SUFFIXES.get(kind, 'bin')}")
    click.echo(str(client.download(job_id, out, variant=variant, resume=resume)))


@jobs.command("events")
@click.argument("job_id")
@click.option("--follow/--no-follow", default=True, show_default=True, help="Live until the job ends.")
@click.option("--after", type=int, default=0, help="Only events after this id.")
@connection
def events(client: gq.Client, job_id: str, follow: bool, after: int) -> None:
    """The job's events, one JSON object per line."""
    for event in client.events(job_id, after=after, follow=follow):
        click.echo(json.dumps(event.raw))
