"""The stage names and the `stage:id=spec` model entries, parsed: what settings validate.

Apart from models/catalog.py so the settings can check their model entries at startup without
importing the catalog, which takes a Settings (no import circle).
"""

from __future__ import annotations

from typing import Literal, get_args

StageName = Literal["text", "video", "image"]


def stages() -> tuple[str, ...]:
    """Every stage that has models, in StageName order (a new stage needs no code here)."""
    return tuple(get_args(StageName))


def parse_extra_models(value: str) -> list[tuple[str, str, str]]:
    """(stage, id, spec) of each `stage:id=spec` entry; ValueError naming a malformed one."""
    out = []
    for item in (i.strip() for i in value.split(",")):
        if not item:
            continue
        head, eq, spec = item.partition("=")
        stage, colon, model_id = head.partition(":")
        if not (eq and colon and spec.strip() and model_id.strip()) or stage.strip() not in stages():
            raise ValueError(f"extra_models entry {item!r} is not like 'text:my-model=/models/dir'")
        out.append((stage.strip(), model_id.strip(), spec.strip()))
    return out
