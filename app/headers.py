"""Headers every answer shares: CORS (flask-cors, origins from settings) and a single Date."""

from __future__ import annotations

from flask import Flask, Response
from flask_cors import CORS

from models.settings import Settings

# What a browser page may read from an answer beyond the CORS-safelisted headers.
EXPOSED = (
    "ETag",
    "Content-Range",
    "Accept-Ranges",
    "Content-Length",
    "Retry-After",
    "X-Request-Id",
    "Location",
    "Idempotent-Replayed",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "RateLimit-Policy",
)
ALLOWED = (
    "Authorization",
    "Content-Type",
    "Idempotency-Key",
    "Prefer",
    "Range",
    "If-None-Match",
    "If-Range",
    "X-Request-Id",
)


def _one_date(resp: Response) -> Response:
    # werkzeug's make_conditional (send_file, the job's ETag) sets Date, and the server (gunicorn,
    # werkzeug's dev server) adds its own: two Date headers. The server's is the one to keep.
    resp.headers.pop("Date", None)
    return resp


def _vary_origin(resp: Response) -> Response:
    # flask-cors leaves Vary out when one origin is configured; a shared cache (media answers
    # are `public`) would then hand an answer without CORS headers to an allowed page.
    resp.vary.add("Origin")
    return resp


def init_app(app: Flask, settings: Settings) -> None:
    app.after_request(_one_date)
    if settings.cors_origins:
        app.after_request(_vary_origin)
        CORS(
            app,
            origins=settings.cors_origins,
            methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"],
            allow_headers=list(ALLOWED),
            expose_headers=list(EXPOSED),
            max_age=600,
            supports_credentials=False,  # API keys go in Authorization, never cookies
        )
