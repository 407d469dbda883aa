"""The HTTP baseline: a bare Flask app with the same routes shapes, returning a small JSON."""

from __future__ import annotations

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue


def create_app() -> Flask:
    """Served by gunicorn exactly like Genqueue (`bench.trivial_app:create_app()`)."""
    app = Flask(__name__)

    @app.post("/v1/jobs")
    def submit() -> ResponseReturnValue:
        body = request.get_json(silent=True) or {}
        return jsonify({"id": "0", "status": "queued", "prompt": body.get("prompt")}), 202

    @app.get("/v1/jobs/<job_id>")
    def get_job(job_id: str) -> ResponseReturnValue:
        return jsonify({"id": job_id, "status": "queued"})

    @app.get("/v1/health")
    def health() -> ResponseReturnValue:
        return jsonify({"status": "ok"})

    return app
