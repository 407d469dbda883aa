"""Serving: dynamic batching, the result cache and waiting, event streams, request limits, job defaults."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ServingSettings(BaseModel):
    """Fields of models.settings.Settings (GENQUEUE_<FIELD>)."""

    # -- dynamic batching (tasks.batching): concurrent stage executions in one worker share a call
    text_batch_max_size: int = Field(8, description="Most text jobs in one model call; 1 turns batching off.")
    text_batch_max_wait_ms: float = Field(
        200.0, description="Longest a text job waits for batch-mates (a lone job waits a quarter of it)."
    )
    video_batch_max_size: int = Field(
        1,
        description="Most same-shaped video requests in one model call. 1 (no batching): the worker's "
        "second thread encodes one job's video while the model renders the next.",
    )
    video_batch_max_wait_ms: float = Field(200.0, description="Longest a video job waits for batch-mates.")
    image_batch_max_size: int = Field(
        4, description="Most same-shaped image jobs in one model call (each brings its `num_images`)."
    )
    image_batch_max_wait_ms: float = Field(200.0, description="Longest an image job waits for batch-mates.")

    # -- result cache (models.cache) and waiting
    cache_enabled: bool = Field(
        True, description="Identical seeded requests reuse a finished or running job's result."
    )
    cache_version: str = Field(
        "1", description="Bump to invalidate every cached result (e.g. new weights under the same name)."
    )
    shot_cache_wait_s: float = Field(
        1.0,
        gt=0,
        description="A storyboard shot whose identical twin is rendering elsewhere looks again after "
        "this many seconds, instead of rendering it a second time (models.shot_cache).",
    )
    queue_position_ttl_s: float = Field(
        1.0, description="How long a web process reuses its queued-jobs counts (`queue_position`)."
    )
    max_wait_s: int = Field(30, description="Upper bound of `Prefer: wait=N` on submit.")
    submit_group_max: int = Field(
        64,
        ge=1,
        description="Most submits a web process commits and publishes together (one INSERT, one "
        "broker round trip): those arriving while a group is written go in the next one (app."
        "submit_groups). `1`: each submit alone.",
    )
    max_waiters: int = Field(
        4, description="Concurrent `Prefer: wait` requests per web process; more answer at once."
    )

    # -- job event streams (GET /v1/jobs/{id}/events)
    stream_max_per_process: int = Field(
        1000,
        ge=1,
        description="Concurrent event streams per web process; past it a new stream gets 503 with "
        "Retry-After (problem+json).",
    )
    stream_max_per_tenant: int = Field(
        100,
        ge=1,
        description="Concurrent event streams of one tenant per web process; past it 429 with "
        "Retry-After (problem+json).",
    )
    stream_heartbeat_s: float = Field(
        15.0,
        gt=0,
        description="Seconds of silence after which a stream sends a comment line (keeps proxies open); "
        "also how long a client that left may keep its stream's slot (the next write notices).",
    )
    stream_poll_s: float = Field(
        2.0,
        description="How often a stream re-reads its job's events when no notification listener is "
        "connected (SQLite, or Postgres unreachable); also the listener's reconnect pause.",
    )
    stream_max_duration_s: float = Field(
        3600.0,
        description="A stream closes after this long (the client resumes with `Last-Event-ID`), so a "
        "restarting web process is never held up by old streams.",
    )

    # -- request limits and job defaults
    max_body_bytes: int = Field(64 * 1024, description="Largest request body; larger ones get 413.")
    max_batch_body_bytes: int = Field(
        4 * 1024 * 1024,
        description="Largest body of POST /v1/jobs/batch (up to 500 jobs); larger ones get 413. "
        "Every other request has max_body_bytes.",
    )
    web_body_timeout_s: float = Field(
        10.0,
        description="Seconds a client has to send a request's whole body once its headers are in; "
        "slower uploads get 408 and the connection closes (the gevent web worker, app/server.py). "
        "The request line and headers have the gunicorn keepalive (5 s) to arrive.",
    )
    max_json_depth: int = Field(
        32,
        ge=1,
        le=500,  # the JSON decoder recurses once per level: far below Python's recursion limit
        description="Deepest nesting of arrays and objects a request body may have (the API's own "
        "bodies need 3); deeper bodies get 400 before they are decoded.",
    )
    prompt_max_chars: int = Field(4000, description="Longest prompt in characters, after normalisation.")
    default_width: int = Field(256, description="Video width when a job does not say.")
    default_height: int = Field(256, description="Video height when a job does not say.")
    default_num_frames: int = Field(17, description="Video frames when a job does not say.")
    default_fps: int = Field(8, description="Video frames per second when a job does not say.")
    default_steps: int = Field(8, description="Diffusion steps when a job does not say.")
    default_image_width: int = Field(
        256, description="Image width when a job does not say (cheap on a CPU; 1024 suits a real Sana)."
    )
    default_image_height: int = Field(256, description="Image height when a job does not say.")
    default_image_guidance: float = Field(
        4.5, description="Image classifier-free guidance scale when a job does not say (Sana's default)."
    )
    default_max_new_tokens: int = Field(64, description="Text tokens generated when a job does not say.")
    # Small models loop at temperature 0 ("it is a new beginning" eight times); these keep the
    # text stage's output readable. Both count only the tokens a job generated, never its prompt.
    text_repetition_penalty: float = Field(
        1.2,
        ge=1.0,
        description="Text stage: divide the scores of tokens a job has already generated by this "
        "(CTRL-style; 1.0 turns it off). Higher: less repetition, but also fewer legitimate repeats.",
    )
    text_no_repeat_ngram_size: int = Field(
        4,
        ge=0,
        description="Text stage: never generate the same run of this many tokens twice in one job's text "
        "(0 turns it off). Lower is stricter.",
    )
