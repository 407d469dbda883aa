"""The stage specs: built from Settings, and what routing, limits, publishing and batching read."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from models import Modality, Stage
from models.settings import Settings
from tasks import failures
from tasks.batching import batcher_for
from tasks.config import celery_config
from tasks.contract import names
from tasks.contract.publish import publish_job
from tasks.contract.stages import (
    ENTRY_STAGE,
    PIPELINES,
    is_final,
    next_stage,
    spec_for,
    stage_of_task,
    stage_specs,
    stages_from,
)
from tasks.generators.base import TextRequest, VideoRequest


def _settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "broker_url": "memory://",
        "text_model": "echo",
        "video_model": "echo",
        "image_model": "echo",
        "text_dtype": "bfloat16",
        "text_soft_time_limit_s": 11,
        "text_time_limit_s": 12,
        "video_soft_time_limit_s": 21,
        "video_time_limit_s": 22,
        "text_batch_max_size": 3,
        "text_batch_max_wait_ms": 30.0,
        "video_batch_max_size": 2,
        "video_batch_max_wait_ms": 40.0,
    }
    return Settings(**(values | overrides))


def test_each_stage_has_one_spec_read_from_settings() -> None:
    specs = stage_specs(_settings())
    assert set(specs) == set(Stage)
    text, video = specs[Stage.TEXT], specs[Stage.VIDEO]
    assert (text.task, text.queue, text.model) == (names.GENERATE_TEXT, "text", "echo")
    assert text.dtype == "bfloat16"
    assert (text.soft_time_limit_s, text.time_limit_s, text.batch_max_size, text.batch_max_wait_s) == (
        11, 12, 3, 0.03,
    )  # fmt: skip
    assert (video.task, video.queue, video.dtype) == (names.GENERATE_VIDEO, "video", "auto")
    assert (video.soft_time_limit_s, video.time_limit_s, video.batch_max_size, video.batch_max_wait_s) == (
        21, 22, 2, 0.04,
    )  # fmt: skip
    assert failures.hard_limit(_settings(), Stage.VIDEO) == 22
    image = specs[Stage.IMAGE]
    assert (image.task, image.queue, image.model) == (names.GENERATE_IMAGE, "image", "echo")
    assert image.batch_shape == ("width", "height", "steps", "guidance_scale")  # num_images may differ
    assert (image.time_limit_s, image.batch_max_size) == (_settings().image_time_limit_s, 4)
    assert spec_for(_settings(), "text") == text  # strings from the edges are converted


def test_unknown_stage_is_named() -> None:
    with pytest.raises(ValueError, match="unknown stage 'storyboard'"):
        spec_for(_settings(), "storyboard")
    assert stage_of_task(names.GENERATE_VIDEO) is Stage.VIDEO
    assert stage_of_task(names.COMPENSATE) is None


def test_celery_routes_and_limits_come_from_the_specs() -> None:
    settings = _settings()
    conf = celery_config(settings)
    for spec in stage_specs(settings).values():
        assert spec.queue in names.ALL_QUEUES
        assert conf["task_routes"][spec.task] == {"queue": spec.queue}
        assert conf["task_annotations"][spec.task] == {
            "soft_time_limit": spec.soft_time_limit_s,
            "time_limit": spec.time_limit_s,
        }


def test_pipelines_enter_at_the_entry_stage() -> None:
    assert set(PIPELINES) == set(Modality)
    assert all(stages[0] is ENTRY_STAGE for stages in PIPELINES.values())
    assert stages_from("video") == (Stage.TEXT, Stage.VIDEO)
    assert stages_from("video", "video") == (Stage.VIDEO,)
    assert stages_from("text") == (Stage.TEXT,)
    assert stages_from("text", "video") == (Stage.VIDEO,)  # the reaper republishing a stray stage
    assert is_final("text", Stage.TEXT) and is_final("video", Stage.VIDEO)
    assert not is_final("video", Stage.TEXT)
    assert stages_from("image") == (Stage.TEXT, Stage.IMAGE) and is_final("image", Stage.IMAGE)
    assert next_stage("image", Stage.TEXT) is Stage.IMAGE and next_stage("video", Stage.TEXT) is Stage.VIDEO
    assert next_stage("image", Stage.IMAGE) is None


@pytest.mark.parametrize(
    ("modality", "start", "first", "chain"),
    [
        ("text", "text", names.GENERATE_TEXT, None),
        ("video", "text", names.GENERATE_TEXT, [names.GENERATE_VIDEO]),
        ("video", "video", names.GENERATE_VIDEO, None),
        ("image", "text", names.GENERATE_TEXT, [names.GENERATE_IMAGE]),
        ("image", "image", names.GENERATE_IMAGE, None),
    ],
)
def test_publish_sends_the_modalitys_stages(
    modality: str, start: str, first: str, chain: list[str] | None
) -> None:
    # What reaches the broker (kombu's in-memory transport), not what was asked of send_task: the
    # message is built once per shape and re-sent with each job's id (tasks.contract.templates).
    app = Celery("stages-test", broker="memory://")
    app.conf.task_default_queue = f"stages-{modality}-{start}"
    for jid in ("j1", "j2"):
        publish_job(app, jid, modality, "normal", stage=start)
    with app.connection() as conn:
        queue = conn.SimpleQueue(app.conf.task_default_queue)
        for jid in ("j1", "j2"):
            message = queue.get(timeout=2)
            message.ack()
            args, _, embed = message.decode()
            assert message.headers["task"] == first and message.headers["id"] == f"{jid}.{start}"
            assert args == [jid]
            # A message's chain is a stack: the next task is popped from its end.
            later = list(reversed(embed["chain"] or []))
            assert [sig["task"] for sig in later] == (chain or [])
            for sig in later:
                assert sig["options"]["task_id"] == f"{jid}.{stage_of_task(sig['task'])}"
                assert sig["args"] == [jid] and sig["immutable"]  # each stage reads the job by id
        queue.close()


def test_batchers_take_their_knobs_and_shape_from_the_spec() -> None:
    settings = _settings()
    video = batcher_for(Stage.VIDEO, settings, model="stages-test-video")
    assert (video.max_size, video.max_wait_s) == (2, 0.04)
    key = video._key
    # Same size and steps share a call whatever the prompt and seed; another size does not.
    assert key(VideoRequest("a", width=256, seed=1)) == key(VideoRequest("b", width=256, seed=2))
    assert key(VideoRequest("a", width=256)) != key(VideoRequest("a", width=512))
    assert key(VideoRequest("a", steps=4)) != key(VideoRequest("a", steps=8))
    text = batcher_for("text", settings, model="stages-test-text")
    assert (text.max_size, text.max_wait_s, text.name) == (3, 0.03, "text:stages-test-text")
    assert text._key(TextRequest("a", max_new_tokens=8)) == text._key(TextRequest("b", max_new_tokens=64))
