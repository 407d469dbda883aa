"""Examples and tags in /openapi.json: a submission, the job it gives, the problems; groups of operations."""

from __future__ import annotations

from typing import Any

from app.errors import PROBLEM_BASE

_ID = "0b6f9c2e-5d1a-4c3e-9f7a-2e8d4b1c6a90"
_CONTENT = f"/v1/jobs/{_ID}/content"
_MEDIA = f"https://api.example.com/v1/media/{_ID}"  # signed links are absolute

SUBMIT = {
    "video": {
        "summary": "A video job",
        "value": {
            "prompt": "a cat dancing on the moon",
            "modality": "video",
            "params": {"width": 256, "height": 256, "num_frames": 17, "seed": 42},
            "priority": "normal",
            "metadata": {"order": "A-1021"},
        },
    },
    "video_model": {
        "summary": "A video job naming its models (GET /v1/models)",
        "value": {
            "prompt": "a cat dancing on the moon",
            "modality": "video",
            "model": {"text": "smollm2", "video": "wan-tiny"},
        },
    },
    "image": {
        "summary": "Two images of one prompt",
        "value": {
            "prompt": "a lighthouse at dusk, oil painting",
            "modality": "image",
            "params": {"width": 512, "height": 384, "num_images": 2, "guidance": 4.5, "seed": 42},
        },
    },
    "text": {
        "summary": "A text job, sampled with a fixed seed",
        "value": {
            "prompt": "a haiku about queues",
            "modality": "text",
            "params": {"max_new_tokens": 64, "temperature": 0.8, "seed": 7},
        },
    },
}

_TIMINGS_QUEUED = {
    "created_at": "2026-12-02T03:00:00Z",
    "started_at": None,
    "text_completed_at": None,
    "completed_at": None,
    "queue_s": None,
    "text_s": None,
    "video_s": None,
    "image_s": None,
    "gpu_s": None,
}
_PARAMS = {
    "width": 256,
    "height": 256,
    "num_frames": 17,
    "fps": 8,
    "steps": 8,
    "max_new_tokens": 64,
    "temperature": 0.0,
    "seed": 42,
}
QUEUED_JOB: dict[str, Any] = {
    "id": _ID,
    "object": "job",
    "status": "queued",
    "stage": None,
    "progress": 0,
    "queue_position": 3,
    "modality": "video",
    "prompt": "a cat dancing on the moon",
    "params": _PARAMS,
    "priority": "normal",
    "outputs": {
        "text": None,
        "text_url": None,
        "video_url": None,
        "thumbnail_url": None,
        "text_signed_url": None,
        "video_signed_url": None,
        "thumbnail_signed_url": None,
        "signed_urls_expire_at": None,
        "images": None,
    },
    "error": None,
    "attempts": 0,
    "degraded": None,
    "models": {
        "text": {"asked": None, "id": None, "version": None},
        "video": {"asked": None, "id": None, "version": None},
    },
    "cached": False,
    "source_job_id": None,
    "timings": _TIMINGS_QUEUED,
    "metadata": {"order": "A-1021"},
    "expires_at": None,
    "data_removed": False,
}
SUCCEEDED_JOB: dict[str, Any] = QUEUED_JOB | {
    "status": "succeeded",
    "stage": "video",
    "progress": 100,
    "queue_position": None,
    "outputs": {
        "text": "A grey cat twirls across the moon's dusty surface, Earth rising behind it in blue light.",
        "text_url": f"{_CONTENT}?variant=text",
        "video_url": f"{_CONTENT}?variant=video",
        "thumbnail_url": f"{_CONTENT}?variant=thumbnail",
        "text_signed_url": f"{_MEDIA}/text?expires=1796184000&sig=Zm9vYmFyYmF6cXV4",
        "video_signed_url": f"{_MEDIA}/video?expires=1796184000&sig=cXV4YmF6YmFyZm9v",
        "thumbnail_signed_url": f"{_MEDIA}/thumbnail?expires=1796184000&sig=YmF6cXV4Zm9vYmFy",
        "signed_urls_expire_at": "2026-12-02T04:00:00Z",
        "images": None,
    },
    "attempts": 1,
    "models": {
        "text": {"asked": None, "id": "smollm2", "version": "1.0.0"},
        "video": {"asked": None, "id": "wan-tiny", "version": "0.35.1"},
    },
    "timings": {
        "created_at": "2026-12-02T03:00:00Z",
        "started_at": "2026-12-02T03:00:01Z",
        "text_completed_at": "2026-12-02T03:00:04Z",
        "completed_at": "2026-12-02T03:00:31Z",
        "queue_s": 1.0,
        "text_s": 2.8,
        "video_s": 26.4,
        "image_s": None,
        "gpu_s": 29.2,
    },
    "expires_at": "2026-12-09T03:00:31Z",
}


_SECOND = {
    "id": "7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f",
    "queue_position": 4,
    "modality": "text",
    "prompt": "a haiku about queues",
    "params": {"max_new_tokens": 64, "temperature": 0.8, "seed": 7},
    "metadata": {},
}


def _problem(status: int, title: str, slug: str, detail: str, **extra: Any) -> dict[str, Any]:
    body = {"type": f"{PROBLEM_BASE}{slug}", "title": title, "status": status, "detail": detail}
    return {"summary": title, "value": body | {"errors": []} | extra}


PROBLEMS: dict[int, dict[str, Any]] = {
    400: _problem(400, "Bad Request", "malformed-request", "The body is not valid JSON."),
    401: _problem(401, "Unauthorized", "unauthorized", "Missing or invalid API key."),
    404: _problem(404, "Not Found", "not-found", f"No job with id {_ID}."),
    409: _problem(409, "Conflict", "conflict", "The job has finished: it can no longer be canceled."),
    410: _problem(410, "Gone", "data-removed", f"Job {_ID}'s outputs were removed (expired or deleted)."),
    422: _problem(
        422,
        "Validation Failed",
        "validation-failed",
        "The request body is invalid.",
        errors=[{"field": "params.width", "message": "Input should be a multiple of 16"}],
    ),
    429: _problem(429, "Too Many Requests", "rate-limited", "Rate limit exceeded: 100 per 1 second."),
    503: _problem(503, "Service Unavailable", "overloaded", "The queue is full; retry later."),
}


TAGS = [
    {"name": "Jobs", "description": "Submit generation jobs, follow them, fetch what they made."},
    {"name": "Webhooks", "description": "Be told when a job changes state (signed, retried)."},
    {"name": "Models", "description": "The models a job may name, and whether they are loaded."},
    {"name": "Usage", "description": "What the tenant's jobs used: outcomes, GPU seconds, tokens, frames."},
    {"name": "Service", "description": "Health, metrics and this reference; no API key needed."},
]


def add_tags(paths: dict[str, Any]) -> None:
    """Group the operations in /docs by what they concern."""
    for path, ops in paths.items():
        tag = (
            "Webhooks" if "webhook" in path
            else "Jobs" if path.startswith(("/v1/jobs", "/v1/media"))
            else "Usage" if path.startswith("/v1/usage")
            else "Models" if path.startswith("/v1/models")
            else "Service"
        )  # fmt: skip
        for op in ops.values():
            op["tags"] = [tag]


def add_examples(paths: dict[str, Any]) -> None:
    """Attach the examples: bodies and jobs to the job operations, a problem to every error answer."""
    jobs = paths["/v1/jobs"]["post"]
    jobs["requestBody"]["content"]["application/json"]["examples"] = SUBMIT
    _job_example(jobs["responses"]["202"], "queued", QUEUED_JOB)
    _job_example(jobs["responses"]["200"], "succeeded", SUCCEEDED_JOB)
    _job_example(paths["/v1/jobs/{job_id}"]["get"]["responses"]["200"], "succeeded", SUCCEEDED_JOB)
    batch = paths["/v1/jobs/batch"]["post"]
    two = {"summary": "A video job and a text job", "value": {"jobs": [v["value"] for v in SUBMIT.values()]}}
    batch["requestBody"]["content"]["application/json"]["examples"] = {"two": two}
    queued = {"summary": "Both queued", "value": {"jobs": [QUEUED_JOB, QUEUED_JOB | _SECOND]}}
    batch["responses"]["202"]["content"]["application/json"]["examples"] = {"queued": queued}
    for ops in paths.values():
        for op in ops.values():
            for code, answer in op["responses"].items():
                content = answer.get("content", {}).get("application/problem+json")
                if content is not None and int(code) in PROBLEMS:
                    content["examples"] = {f"{code}": PROBLEMS[int(code)]}


def _job_example(answer: dict[str, Any], name: str, job: dict[str, Any]) -> None:
    answer["content"]["application/json"]["examples"] = {name: {"summary": f"A {name} job", "value": job}}
