"""A storyboard's title and shots, parsed from the text model's reply (JSON, repaired, or split)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, StringConstraints, ValidationError

Shot = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=1000)]
How = Literal["json", "repaired", "split"]


class ShotList(BaseModel):
    title: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
    shots: list[Shot]


def storyboard_instruction(count: int) -> str:
    """The system prompt asking for `count` shots as JSON only."""
    return (
        f"Plan a short film as {count} shots. Reply with JSON only: "
        '{"title": "...", "shots": ["...", ...]} '
        f"with exactly {count} shots, each one concrete sentence: the subject, the action, the setting, "
        "the lighting and the camera."
    )


def _title(prompt: str) -> str:
    return " ".join(prompt.split()[:8])[:200] or "Storyboard"


def _pieces(text: str) -> list[str]:
    lines = [re.sub(r"^\s*(?:\d+[.):]|[-*•])\s*", "", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if len(lines) > 1:
        return [p[:1000] for p in lines]
    parts = re.split(r"(?<=[.!?])\s+", " ".join(lines))
    return [p.strip()[:1000] for p in parts if p.strip()]


def _fit(pieces: list[str], count: int, prompt: str) -> list[str]:
    """Exactly `count` shots: extra pieces merged in order, too few reused with a shot suffix."""
    pieces = pieces or [prompt.strip() or "A scene"]
    if len(pieces) >= count:
        out = []
        for i in range(count):
            group = pieces[i * len(pieces) // count : (i + 1) * len(pieces) // count]
            out.append(" ".join(group)[:1000])
        return out
    fitted = list(pieces)
    for i in range(len(pieces), count):
        suffix = f" (shot {i + 1} of {count})"
        fitted.append(pieces[i % len(pieces)][: 1000 - len(suffix)] + suffix)
    return fitted


def _from_data(data: Any, prompt: str) -> ShotList | None:
    if isinstance(data, list):
        data = {"title": _title(prompt), "shots": data}
    if not isinstance(data, dict) or not isinstance(data.get("shots"), list):
        return None
    shots = [s.get("description") if isinstance(s, dict) else s for s in data["shots"]]
    shots = [s.strip()[:1000] for s in shots if isinstance(s, str) and s.strip()]
    title = data.get("title")
    title = title.strip()[:200] if isinstance(title, str) and title.strip() else _title(prompt)
    try:
        return ShotList(title=title, shots=shots) if shots else None
    except ValidationError:
        return None


def _repair(text: str) -> Any:
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    body = text[start:]
    body = re.sub(r"'([^'\"]*)'", r'"\1"', body)
    for candidate in (body, body[: body.rfind("}") + 1] if "}" in body else body):
        fixed = re.sub(r",\s*([\]}])", r"\1", candidate)
        for tail in ("", '"', "]", "]}", '"]}', '"]', "}"):
            try:
                return json.loads(fixed + tail)
            except ValueError:
                continue
    return None


def parse_shot_list(text: str, count: int, prompt: str) -> tuple[ShotList, How]:
    """The reply as exactly `count` shots, and whether it was clean JSON, repaired, or split."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    stripped = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", text.strip())
    how: How = "json"
    try:
        data = json.loads(stripped)
        parsed = _from_data(data, prompt)
        how = "repaired" if isinstance(data, list) else how  # no title: taken from the prompt
    except ValueError:
        parsed = None
    if parsed is None:
        how, parsed = "repaired", _from_data(_repair(stripped), prompt)
    if parsed is None:
        return ShotList(title=_title(prompt), shots=_fit(_pieces(stripped), count, prompt)), "split"
    if len(parsed.shots) < count:
        how = "repaired"
    shots = parsed.shots[:count] if len(parsed.shots) >= count else _fit(parsed.shots, count, prompt)
    return ShotList(title=parsed.title, shots=shots), how
