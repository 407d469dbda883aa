"""The interactive API reference at /docs (Swagger UI over /openapi.json): its page and its assets."""

from __future__ import annotations

import html
import importlib.metadata
import importlib.resources
import urllib.parse
from typing import Any

from flask import Blueprint, Response, abort, request

from models.settings import Settings

bp = Blueprint("api_docs", __name__)

UI_DIST = "flask-swagger-ui"  # ships Swagger UI's dist/ inside its wheel: nothing comes from a CDN
UI_ASSETS = ("swagger-ui.css", "swagger-ui-bundle.js")
INIT_JS = "genqueue-docs.js"
ASSETS = (*UI_ASSETS, INIT_JS)
ASSET_TYPES = {".css": "text/css", ".js": "text/javascript"}
# The URLs carry the UI's version (?v=), so a year's caching never serves an upgrade stale.
CACHE_FOREVER = "public, max-age=31536000, immutable"

# Outside the page so that a Content-Security-Policy of `script-src 'self'` still lets it run.
_INIT = """\
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: document.body.dataset.spec,
    dom_id: "#swagger-ui",
    deepLinking: true,
    persistAuthorization: true,
    displayOperationId: true,
    defaultModelsExpandDepth: 0,
    tryItOutEnabled: false,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout"
  });
});
"""


def csp(settings: Settings) -> str:
    """The page's Content-Security-Policy: our files only, no inline script; "Try it out" may call
    this origin and the document's server (public_base_url)."""
    origin = urllib.parse.urlsplit(settings.public_base_url)
    api = (
        f" {origin.scheme}://{origin.netloc}" if origin.scheme in ("http", "https") and origin.netloc else ""
    )
    return (
        "default-src 'none'; script-src 'self'; img-src 'self' data:; "
        # Swagger UI (React) sets style attributes: inline styles are needed, inline scripts are not.
        "style-src 'self' 'unsafe-inline'; "
        f"connect-src 'self'{api}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def ui_version() -> str:
    return importlib.metadata.version(UI_DIST)


def _asset_bytes(name: str) -> bytes:
    if name == INIT_JS:
        return _INIT.encode()
    return importlib.resources.files("flask_swagger_ui").joinpath("dist", name).read_bytes()


def page(paths: dict[str, Any]) -> str:
    """The /docs page (app.openapi serves it); without JavaScript it still lists every operation."""
    version = html.escape(ui_version())
    rows = "".join(
        f"<tr><td><code>{html.escape(method.upper())}</code></td><td><code>{html.escape(path)}</code></td>"
        f"<td>{html.escape(op.get('summary', ''))}</td></tr>"
        for path, ops in paths.items()
        for method, op in ops.items()
    )
    # Relative URLs, like the link to openapi.json: right behind a proxy that mounts us under a prefix.
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'><title>Genqueue API</title>"
        f"<link rel=stylesheet href='docs/assets/swagger-ui.css?v={version}'></head>"
        "<body data-spec=openapi.json><div id=swagger-ui></div>"
        "<noscript><h1>Genqueue API</h1><p>Machine-readable: <a href=openapi.json>/openapi.json</a> "
        f"(OpenAPI 3.1).</p><table><tr><th>Method</th><th>Path</th><th>Summary</th></tr>{rows}</table>"
        "</noscript>"
        f"<script src='docs/assets/swagger-ui-bundle.js?v={version}'></script>"
        f"<script src='docs/assets/{INIT_JS}?v={version}'></script></body></html>"
    )


@bp.get("/docs/assets/<name>")
def asset(name: str) -> Response:
    if name not in ASSETS:
        abort(404)
    resp = Response(_asset_bytes(name), mimetype=ASSET_TYPES[name[name.rindex(".") :]])
    resp.headers["Cache-Control"] = CACHE_FOREVER
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.add_etag()
    resp.make_conditional(request)  # in place: a 304 for a matching If-None-Match
    return resp
