"""The storyboard reply parser: JSON, repaired JSON, and the split fallback, always exactly N shots."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from models.shot_list import ShotList, parse_shot_list, storyboard_instruction
from tasks.contract.prompt_limit import SYSTEM_PROMPT

PROMPT = "a fox crosses a frozen lake at dawn while the wind picks up snow"


def test_json_and_fenced_json_and_objects() -> None:
    text = '{"title": " Fox ", "shots": ["a", "b", "c"]}'
    assert parse_shot_list(text, 3, PROMPT) == (ShotList(title="Fox", shots=["a", "b", "c"]), "json")
    assert parse_shot_list(f"```json\n{text}\n```", 3, PROMPT)[1] == "json"
    objs = '{"title": "T", "shots": [{"description": "x"}, {"description": "y"}]}'
    assert parse_shot_list(objs, 2, PROMPT)[0].shots == ["x", "y"]


def test_repaired_trailing_comma_truncated_and_bare_list() -> None:
    shots, how = parse_shot_list('Sure! {"title": "T", "shots": ["a", "b",]} hope it helps', 2, PROMPT)
    assert (shots.shots, how) == (["a", "b"], "repaired")
    shots, how = parse_shot_list('{"title": "T", "shots": ["a", "b"', 2, PROMPT)
    assert (shots.shots, how) == (["a", "b"], "repaired")
    shots, how = parse_shot_list('["a", "b"]', 2, PROMPT)
    assert (shots.title, how) == ("a fox crosses a frozen lake at dawn", "repaired")


def test_too_many_and_too_few() -> None:
    many = '{"title": "T", "shots": ["a", "b", "c", "d"]}'
    assert parse_shot_list(many, 2, PROMPT) == (ShotList(title="T", shots=["a", "b"]), "json")
    shots, how = parse_shot_list('{"title": "T", "shots": ["a", "b"]}', 4, PROMPT)
    assert (shots.shots, how) == (["a", "b", "a (shot 3 of 4)", "b (shot 4 of 4)"], "repaired")


def test_split_prose_and_empty_and_determinism() -> None:
    prose = "The fox wakes. It walks to the lake. Snow blows. The sun rises. It runs."
    shots, how = parse_shot_list(prose, 3, PROMPT)
    assert how == "split" and len(shots.shots) == 3 and all(shots.shots)
    assert parse_shot_list(prose, 3, PROMPT) == (shots, how)
    shots, how = parse_shot_list("", 2, PROMPT)
    assert how == "split" and shots.shots == [PROMPT, f"{PROMPT} (shot 2 of 2)"]


def test_model_rejects_empty() -> None:
    with pytest.raises(ValidationError):
        ShotList(title=" ", shots=["a"])
    with pytest.raises(ValidationError):
        ShotList(title="T", shots=["  "])


def test_instruction_is_short() -> None:
    assert len(storyboard_instruction(12)) <= len(SYSTEM_PROMPT) + 120
    assert "exactly 12" in storyboard_instruction(12)
