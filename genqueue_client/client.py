"""The blocking client: drives genqueue_client.core's operations with an httpx.Client."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx

from genqueue_client.core import (
    Core,
    Op,
    Sleep,
    StreamUnavailable,
    download_mode,
    error_of,
    progress_event,
    stream_action,
    timeout_until,
)
from genqueue_client.errors import WaitTimeout
from genqueue_client.models import Event, Job, Model
from genqueue_client.sse import Decoder

T = TypeVar("T")
STREAM_READ_TIMEOUT_S = 45.0  # three of the server's heartbeats


class Client:
    """Genqueue's API over HTTP. `base_url` and `api_key` default to GENQUEUE_URL and
    GENQUEUE_API_KEY. Every call retries 429/503 (after Retry-After) and connection failures up
    to `max_retries` times; a submit carries an Idempotency-Key, so a retried one runs once."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 60.0,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.core = Core(
            base_url, api_key, max_retries=max_retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s
        )
        self._http = http_client or httpx.Client(timeout=timeout)
        self._owned = http_client is None

    def close(self) -> None:
        if self._owned:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _run(self, op: Op[T]) -> T:
        try:
            step = next(op)
            while True:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    step = op.send(None)
                    continue
                try:
                    resp = self._http.send(step)
                except httpx.TransportError as exc:
                    step = op.throw(exc)
                    continue
                step = op.send(resp)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def submit(self, prompt: str, modality: str = "video", **options: Any) -> Job:
        """POST /v1/jobs. Options: params, priority, metadata, webhook, cache, model (an id from
        models(), or stage -> id), idempotency_key
        (default: a new UUID, kept across this call's retries), wait_s (Prefer: wait=N)."""
        return self._run(self.core.submit(prompt, modality, **options))

    def get(self, job_id: str) -> Job:
        return self._run(self.core.get(job_id))

    def list(self, *, status: str | None = None, page_size: int | None = None) -> Iterator[Job]:
        """Every job, newest first, fetching page after page as the iteration goes."""
        cursor: str | None = None
        while True:
            page = self._run(self.core.page(status, page_size, cursor))
            yield from page.data
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel(self, job_id: str) -> Job:
        return self._run(self.core.cancel(job_id))

    def delete(self, job_id: str) -> None:
        self._run(self.core.delete(job_id))

    def models(self) -> builtins.list[Model]:  # `list` here is the method
        """GET /v1/models: the models a job may name (`model=`), with the caller's plan's say."""
        return self._run(self.core.models())

    def webhook_secret(self) -> str:
        return self._run(self.core.webhook_secret())

    def events(self, job_id: str, *, after: int = 0, follow: bool = True) -> Iterator[Event]:
        """The job's events after id `after`. follow: live (SSE) until the server ends the stream
        after the terminal event (a succeeded job's output variants: after each one's
        `job.variant.completed`), reconnecting with Last-Event-ID; otherwise the stored ones,
        page by page."""
        if follow:
            yield from self._follow(job_id, after, fallback=False, deadline=None)
            return
        while True:
            page = self._run(self.core.event_page(job_id, after))
            yield from page.data
            if not page.has_more:
                return
            after = page.next_after

    def _follow(self, job_id: str, after: int, fallback: bool, deadline: float | None) -> Iterator[Event]:
        last, retry, finished = after, self.core.retry(), False
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise WaitTimeout(f"job {job_id} did not finish in time")
            req = self.core.stream_request(job_id, last, timeout_until(deadline, now, STREAM_READ_TIMEOUT_S))
            try:
                resp = self._http.send(req, stream=True)
                try:
                    action = stream_action(resp, retry, fallback)
                    if action == "unavailable":
                        raise StreamUnavailable(resp.status_code)
                    if action == "error":
                        resp.read()
                        raise error_of(resp)
                    if isinstance(action, float):
                        time.sleep(action)
                        continue
                    decoder = Decoder()
                    for line in resp.iter_lines():
                        if deadline is not None and time.monotonic() >= deadline:
                            raise WaitTimeout(f"job {job_id} did not finish in time")
                        event = decoder.line(line)
                        if decoder.alive:
                            retry.attempt = 0  # a live stream: any later drop starts a fresh budget
                        if event is None:
                            continue
                        if event.id is not None:
                            last = event.id
                        yield event
                        finished = finished or event.terminal
                    if finished:
                        return  # the server ends the stream once nothing more will come
                finally:
                    resp.close()
            except httpx.TransportError as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(f"job {job_id} did not finish in time") from exc
                time.sleep(retry.after_transport_error(exc))
                continue
            # It ended before the terminal event: its time limit (resume at once), or a close
            # with nothing sent at all (back off; a job that is gone answers 404 next time).
            if not decoder.alive:
                time.sleep(retry.after_transport_error(httpx.ReadError("the stream closed at once")))

    def wait(
        self,
        job_id: str,
        *,
        timeout: float | None = None,
        poll_s: float = 1.0,
        on_event: Callable[[Event], None] | None = None,
        stream: bool = True,
    ) -> Job:
        """The job once it has finished. Follows its events stream (resuming with
        Last-Event-ID); where no stream can be had, polls every `poll_s`. `on_event` sees each
        event (live progress included). WaitTimeout after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.get(job_id)
        if job.finished:
            return job
        if stream:
            try:
                for event in self._follow(job_id, 0, fallback=True, deadline=deadline):
                    if on_event is not None:
                        on_event(event)
                    if event.terminal:
                        return self.get(job_id)
            except StreamUnavailable:
                pass
        seen = (job.stage, job.progress)
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"job {job_id} did not finish in time")
            time.sleep(poll_s)
            job = self.get(job_id)
            if on_event is not None and (job.stage, job.progress) != seen:
                seen = (job.stage, job.progress)
                on_event(progress_event(job))
            if job.finished:
                return job

    def download(
        self, job_id: str, path: str | Path, *, variant: str | None = None, resume: bool = True
    ) -> Path:
        """Write the job's content (default: its video, or text) to `path`. A partial file there
        is continued with Range (resume=False starts over); a broken transfer resumes too."""
        path, retry = Path(path), self.core.retry()
        while True:
            offset = path.stat().st_size if resume and path.exists() else 0
            try:
                resp = self._http.send(self.core.download_request(job_id, variant, offset), stream=True)
                try:
                    mode = download_mode(resp, offset)
                    if mode == "complete":
                        return path
                    if mode == "restart":
                        path.unlink(missing_ok=True)  # the next request has no Range: a 200
                        continue
                    if mode == "error":
                        resp.read()
                        delay = retry.after_response(resp)
                        if delay is None:
                            raise error_of(resp)
                        time.sleep(delay)
                        continue
                    resume = True  # from here on the file holds this content's first bytes
                    with path.open("ab" if mode == "append" else "wb") as out:
                        for chunk in resp.iter_bytes():
                            out.write(chunk)
                    return path
                finally:
                    resp.close()
            except httpx.TransportError as exc:
                time.sleep(retry.after_transport_error(exc))
