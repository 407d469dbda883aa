"""What the sync and async clients share: request building, response parsing, the retry policy.

Each API call is a generator (sans I/O): it yields an `httpx.Request` and is sent the response,
or yields a `Sleep`; `Client` drives it with blocking calls, `AsyncClient` with awaits. So a
request is built, retried and parsed by the same lines in both. Transport failures are thrown
into the generator, which decides whether to retry.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from genqueue_client.errors import APIError, TransportError, from_response, parse_retry_after
from genqueue_client.models import Event, EventPage, Job, Model, Page

T = TypeVar("T")
URL_ENV, KEY_ENV = "GENQUEUE_URL", "GENQUEUE_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8000"
RETRIED = frozenset({429, 503})  # refusals that say when to come back (Retry-After)
STREAM = "text/event-stream"
USER_AGENT = "genqueue-client/0.1"


@dataclass(frozen=True)
class Sleep:
    seconds: float


Step = httpx.Request | Sleep
Op = Generator[Step, httpx.Response | None, T]


class StreamUnavailable(Exception):
    """The events stream cannot be had now (a stream cap, or no event-stream answer): poll."""


@dataclass
class Retry:
    """One request's retry budget: Retry-After when the server gives one, else exponential
    backoff with jitter; a Retry-After beyond `max_backoff_s` is not waited for."""

    max_retries: int
    backoff_s: float
    max_backoff_s: float
    attempt: int = 0

    def after_response(self, resp: httpx.Response) -> float | None:
        """Seconds to wait before sending again, or None: the answer stands."""
        if resp.status_code not in RETRIED or self.attempt >= self.max_retries:
            return None
        hinted = parse_retry_after(resp.headers.get("retry-after"))
        if hinted is not None and hinted > self.max_backoff_s:
            return None
        self.attempt += 1
        return hinted if hinted is not None else self._backoff()

    def after_transport_error(self, exc: httpx.TransportError) -> float:
        """Seconds to wait before trying again; raises TransportError once the budget is spent."""
        if self.attempt >= self.max_retries:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        self.attempt += 1
        return self._backoff()

    def _backoff(self) -> float:
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** (self.attempt - 1))
        return random.uniform(ceiling / 2, ceiling)


def error_of(resp: httpx.Response) -> APIError:
    """The typed error for a read error answer."""
    return from_response(resp.status_code, resp.content, resp.headers)


class Core:
    """Configuration and the operations, as generators (see the module docstring)."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        *,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 60.0,
    ) -> None:
        self.base_url = (base_url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get(KEY_ENV)
        self.max_retries, self.backoff_s, self.max_backoff_s = max_retries, backoff_s, max_backoff_s

    def headers(self) -> dict[str, str]:
        """Sent on every request (the HTTP client's defaults)."""
        out = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    def retry(self) -> Retry:
        return Retry(self.max_retries, self.backoff_s, self.max_backoff_s)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Request:
        query = {k: v for k, v in (params or {}).items() if v is not None}  # never `?cursor=`
        return httpx.Request(
            method,
            f"{self.base_url}{path}",
            params=query,
            json=json,
            headers={**self.headers(), **(headers or {})},
        )

    def call(self, req: httpx.Request) -> Op[httpx.Response]:
        """Send `req` until it gets an answer that stands; an error answer raises its class."""
        retry = self.retry()
        while True:
            try:
                resp = yield req
            except httpx.TransportError as exc:
                yield Sleep(retry.after_transport_error(exc))
                continue
            assert resp is not None
            if resp.status_code < 400:
                return resp
            delay = retry.after_response(resp)
            if delay is None:
                raise error_of(resp)
            yield Sleep(delay)

    # The operations. Every one is safe to send again: a submit carries an Idempotency-Key.

    def submit(
        self,
        prompt: str,
        modality: str = "video",
        *,
        params: Mapping[str, Any] | None = None,
        priority: str | None = None,
        metadata: Mapping[str, str] | None = None,
        webhook: Mapping[str, Any] | None = None,
        cache: bool | None = None,
        model: str | Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        wait_s: int | None = None,
    ) -> Op[Job]:
        body: dict[str, Any] = {"prompt": prompt, "modality": modality}
        optional = {
            "params": params,
            "priority": priority,
            "metadata": metadata,
            "webhook": webhook,
            "model": model,  # an id (the output stage's), or stage -> id
        }
        body |= {k: dict(v) if isinstance(v, Mapping) else v for k, v in optional.items() if v is not None}
        if cache is not None:
            body["cache"] = cache
        headers = {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        if wait_s:
            headers["Prefer"] = f"wait={wait_s}"
        req = self.request("POST", "/v1/jobs", json=body, headers=headers)
        if wait_s:  # the server holds the answer up to wait_s: the read timeout must outlast it
            req.extensions["timeout"] = httpx.Timeout(10.0, read=wait_s + 30.0).as_dict()
        resp = yield from self.call(req)
        return Job.from_json(resp.json())

    def get(self, job_id: str) -> Op[Job]:
        resp = yield from self.call(self.request("GET", f"/v1/jobs/{job_id}"))
        return Job.from_json(resp.json())

    def page(
        self, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> Op[Page]:
        params = {"status": status, "limit": limit, "cursor": cursor}
        resp = yield from self.call(self.request("GET", "/v1/jobs", params=params))
        body = resp.json()
        return Page([Job.from_json(j) for j in body["data"]], body.get("next_cursor"))

    def cancel(self, job_id: str) -> Op[Job]:
        resp = yield from self.call(self.request("POST", f"/v1/jobs/{job_id}/cancel"))
        return Job.from_json(resp.json())

    def delete(self, job_id: str) -> Op[None]:
        yield from self.call(self.request("DELETE", f"/v1/jobs/{job_id}"))

    def event_page(self, job_id: str, after: int = 0, limit: int | None = None) -> Op[EventPage]:
        params = {"after": after or None, "limit": limit}
        resp = yield from self.call(self.request("GET", f"/v1/jobs/{job_id}/events", params=params))
        body = resp.json()
        events = [Event.from_json(e) for e in body["data"]]
        return EventPage(events, bool(body.get("has_more")), int(body.get("next_after") or after))

    def models(self) -> Op[list[Model]]:
        resp = yield from self.call(self.request("GET", "/v1/models"))
        return [Model.from_json(m) for m in resp.json()["data"]]

    def webhook_secret(self) -> Op[str]:
        resp = yield from self.call(self.request("GET", "/v1/webhooks/secret"))
        return str(resp.json()["secret"])

    # Streaming answers (the drivers read their bodies): requests and how to take the answer.

    def stream_request(self, job_id: str, last_event_id: int, read_timeout: float) -> httpx.Request:
        """The stream from after `last_event_id`: the server replays what was missed, then goes live."""
        headers = {"Accept": STREAM, "Cache-Control": "no-cache"}
        if last_event_id:
            headers["Last-Event-ID"] = str(last_event_id)
        req = self.request("GET", f"/v1/jobs/{job_id}/events", headers=headers)
        # Heartbeats come every 15 s: a longer silence is a dead connection; reconnect.
        req.extensions["timeout"] = httpx.Timeout(10.0, read=read_timeout).as_dict()
        return req

    def download_request(self, job_id: str, variant: str | None, offset: int) -> httpx.Request:
        # Range resumes a partial file; identity: a byte offset must mean the file's bytes.
        headers = {"Accept": "*/*", "Accept-Encoding": "identity"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        return self.request("GET", f"/v1/jobs/{job_id}/content", params={"variant": variant}, headers=headers)


def stream_action(resp: httpx.Response, retry: Retry, fallback: bool) -> float | str:
    """How to take an events stream answer: `events` (read it), a delay (close it, wait and
    connect again), `unavailable` (poll instead: no stream, or, when `fallback`, a stream cap's
    429/503), or `error` (read the body and raise error_of)."""
    if resp.status_code == 200:
        return "events" if resp.headers.get("content-type", "").startswith(STREAM) else "unavailable"
    if resp.status_code in RETRIED:
        if fallback:
            return "unavailable"
        delay = retry.after_response(resp)
        if delay is not None:
            return delay
    return "error"


def download_mode(resp: httpx.Response, offset: int) -> str:
    """How to take a content answer to a request from byte `offset`: `append` (206 from there),
    `replace` (200: the whole body), `complete` (416 and the file is already whole), `restart`
    (the partial file does not fit the content: remove it, start again), or `error`."""
    if resp.status_code == 206:
        start = resp.headers.get("content-range", "").removeprefix("bytes ").split("-", 1)[0]
        return "append" if start == str(offset) else "restart"
    if resp.status_code == 200:
        return "replace"
    if resp.status_code == 416 and offset:
        total = resp.headers.get("content-range", "").rpartition("/")[2]
        return "complete" if total == str(offset) else "restart"
    return "error"


def progress_event(job: Job) -> Event:
    """What polling reports when a job moves: shaped like a stream's live progress event."""
    data = {"progress": job.progress}
    return Event(
        None, "job.progress", job.stage, data, {"type": "job.progress", "stage": job.stage, "data": data}
    )


def timeout_until(deadline: float | None, now: float, default: float) -> float:
    """A stream's read timeout: the client's own, or less so that `wait` keeps its deadline."""
    return default if deadline is None else max(0.1, min(default, deadline - now))
