"""GET /v1/usage: the calling tenant's usage over a window (models.usage), never another's."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify, request
from pydantic import ValidationError

from app.auth import tenant_id
from app.errors import ValidationFailed
from app.schemas import UsageQuery, field_errors
from app.services import services
from models.db import transaction
from models.usage import GroupBy, WindowError, usage_resource, window

bp = Blueprint("usage", __name__, url_prefix="/v1")


@bp.get("/usage")
def get_usage() -> Response:
    """No tenant parameter: the API key decides whose jobs are counted."""
    try:
        query = UsageQuery.model_validate(request.args.to_dict())
        start, end = window(query.start, query.end)
    except ValidationError as exc:
        raise ValidationFailed(errors=field_errors(exc, None)) from None
    except WindowError as exc:
        raise ValidationFailed(errors=[{"field": exc.field, "message": exc.message}]) from None
    group_by = GroupBy(query.group_by) if query.group_by else None
    with transaction(services().sessions) as s:
        body = usage_resource(s, tenant_id(), start, end, group_by)
    return jsonify(body)
