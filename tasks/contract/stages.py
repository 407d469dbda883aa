"""One spec per pipeline stage (task, queue, model, time limits, batching), looked up instead of branched on.

Adding a stage (image, storyboard shots) means a member of models.Stage, its task and queue name
below, a `StageSpec` in `stage_specs`, and its place in the PIPELINES of the modalities that run it;
the publisher, the Celery routes and limits, the batcher, the preloader and the failure policy
read it from here. Torch-free and light, so app/ may import it; nothing runs at import time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from models.job import Modality, Stage
from models.settings import Settings
from tasks.contract import names

# Wire names: renaming one strands the messages already queued (see tasks.contract.names).
TASKS: Mapping[Stage, str] = {
    Stage.TEXT: names.GENERATE_TEXT,
    Stage.VIDEO: names.GENERATE_VIDEO,
    Stage.IMAGE: names.GENERATE_IMAGE,
    Stage.SHOTS: names.START_SHOTS,
    Stage.STITCH: names.STITCH_SHOTS,
}
QUEUES: Mapping[Stage, str] = {
    Stage.TEXT: names.TEXT_QUEUE,
    Stage.VIDEO: names.VIDEO_QUEUE,
    Stage.IMAGE: names.IMAGE_QUEUE,
    Stage.SHOTS: names.DEFAULT_QUEUE,  # only sends the shots' group: the renders go to the video queue
    Stage.STITCH: names.VIDEO_QUEUE,
}

# The stages each modality runs, in order: the first is where a job enters (queued -> running),
# the last is the one that finishes it.
PIPELINES: Mapping[Modality, tuple[Stage, ...]] = {
    Modality.TEXT: (Stage.TEXT,),
    Modality.VIDEO: (Stage.TEXT, Stage.VIDEO),
    Modality.IMAGE: (Stage.TEXT, Stage.IMAGE),
    Modality.STORYBOARD: (Stage.TEXT, Stage.SHOTS, Stage.STITCH),
}
# Stages that fan out: a message's chain ends with one, and whoever finishes the fan-out (the
# storyboard's last shot) sends the stage after it.
FAN_OUT: frozenset[Stage] = frozenset({Stage.SHOTS})
ENTRY_STAGE = Stage.TEXT  # every pipeline starts here (models.states.start_text)
# The catalog stage whose model a pipeline stage runs, where it is not its own: a storyboard's
# shots are video renders, its stitch runs no model.
_MODEL_STAGE: Mapping[Stage, Stage | None] = {Stage.SHOTS: Stage.VIDEO, Stage.STITCH: None}


@dataclass(frozen=True)
class StageSpec:
    """What the code needs to know about one stage, read from Settings."""

    stage: Stage
    task: str  # the stable Celery task name
    queue: str
    model: str  # registered model name or local directory (tasks.generators.registry)
    dtype: str  # "auto": the adapter picks
    soft_time_limit_s: int  # SoftTimeLimitExceeded -> the `timeout` failure (or a degraded retry)
    time_limit_s: int  # the hard limit: the pool kills the task; overdue deadlines derive from it
    batch_max_size: int  # 1 turns batching off
    batch_max_wait_s: float
    # Request fields that must be equal for requests to share one generate() call.
    batch_shape: tuple[str, ...] = ()


def stage_specs(settings: Settings) -> Mapping[Stage, StageSpec]:
    """Every stage's spec under these settings (cheap: build it where needed, no caching)."""
    s = settings
    return {
        Stage.TEXT: StageSpec(
            stage=Stage.TEXT,
            task=TASKS[Stage.TEXT],
            queue=QUEUES[Stage.TEXT],
            model=s.text_model,
            dtype=s.text_dtype,
            soft_time_limit_s=s.text_soft_time_limit_s,
            time_limit_s=s.text_time_limit_s,
            batch_max_size=s.text_batch_max_size,
            batch_max_wait_s=s.text_batch_max_wait_ms / 1000,
        ),
        Stage.VIDEO: StageSpec(
            stage=Stage.VIDEO,
            task=TASKS[Stage.VIDEO],
            queue=QUEUES[Stage.VIDEO],
            model=s.video_model,
            dtype="auto",  # the video adapters choose their own (GENQUEUE_TEXT_DTYPE is text only)
            soft_time_limit_s=s.video_soft_time_limit_s,
            time_limit_s=s.video_time_limit_s,
            batch_max_size=s.video_batch_max_size,
            batch_max_wait_s=s.video_batch_max_wait_ms / 1000,
            batch_shape=("width", "height", "num_frames", "steps", "guidance_scale"),
        ),
        Stage.IMAGE: StageSpec(
            stage=Stage.IMAGE,
            task=TASKS[Stage.IMAGE],
            queue=QUEUES[Stage.IMAGE],
            model=s.image_model,
            dtype="auto",
            soft_time_limit_s=s.image_soft_time_limit_s,
            time_limit_s=s.image_time_limit_s,
            batch_max_size=s.image_batch_max_size,
            batch_max_wait_s=s.image_batch_max_wait_ms / 1000,
            # num_images may differ: each request brings its own rows to the one call.
            batch_shape=("width", "height", "steps", "guidance_scale"),
        ),
        # A storyboard's shots run as video renders (the video model, limits and batching);
        # this spec is the fan-out task's, which only publishes them.
        Stage.SHOTS: StageSpec(
            stage=Stage.SHOTS,
            task=TASKS[Stage.SHOTS],
            queue=QUEUES[Stage.SHOTS],
            model=s.video_model,
            dtype="auto",
            soft_time_limit_s=s.video_soft_time_limit_s,
            time_limit_s=s.video_time_limit_s,
            batch_max_size=1,
            batch_max_wait_s=0.0,
        ),
        Stage.STITCH: StageSpec(
            stage=Stage.STITCH,
            task=TASKS[Stage.STITCH],
            queue=QUEUES[Stage.STITCH],
            model="",  # no model: PyAV joins the shots' files
            dtype="auto",
            soft_time_limit_s=s.video_soft_time_limit_s,
            time_limit_s=s.video_time_limit_s,
            batch_max_size=1,
            batch_max_wait_s=0.0,
        ),
    }


def as_stage(value: str) -> Stage:
    """A stage name from the edges (settings, messages, database rows) as a Stage; ValueError if unknown."""
    try:
        return Stage(value)
    except ValueError:
        raise ValueError(f"unknown stage {value!r}; expected one of {', '.join(Stage)}") from None


def spec_for(settings: Settings, stage: Stage | str) -> StageSpec:
    """The spec of one stage (a plain string is converted here, at the edge)."""
    return stage_specs(settings)[as_stage(stage)]


def stage_of_task(task_name: str | None) -> Stage | None:
    """The stage a task name runs, None for the tasks that are not a stage (compensate, webhooks...)."""
    return next((stage for stage, name in TASKS.items() if name == task_name), None)


def stages_from(modality: str, start: Stage | str = ENTRY_STAGE) -> tuple[Stage, ...]:
    """The stages a `modality` job still runs from `start` on (the reaper republishes mid-pipeline)."""
    stages = PIPELINES[Modality(modality)]
    first = as_stage(start)
    return stages[stages.index(first) :] if first in stages else (first,)


def chained(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """The stages one message's chain carries: up to and including the first fan-out stage."""
    for at, stage in enumerate(stages):
        if stage in FAN_OUT:
            return stages[: at + 1]
    return stages


def model_stages(modality: str) -> tuple[Stage, ...]:
    """The catalog stages (text, video, image) whose models a `modality` job runs, in order."""
    out: list[Stage] = []
    for stage in PIPELINES[Modality(modality)]:
        model_stage = _MODEL_STAGE.get(stage, stage)
        if model_stage is not None and model_stage not in out:
            out.append(model_stage)
    return tuple(out)


def is_final(modality: str, stage: Stage) -> bool:
    """Whether finishing `stage` finishes a `modality` job."""
    return PIPELINES[Modality(modality)][-1] == stage


def next_stage(modality: str, stage: Stage) -> Stage | None:
    """The stage a `modality` job runs after `stage`, None after its last."""
    stages = PIPELINES[Modality(modality)]
    at = stages.index(stage)
    return stages[at + 1] if at + 1 < len(stages) else None


# The stages that render files (the final stage of a video or image job): degradation,
# artifacts and the content endpoint concern these.
RENDER_STAGES = (Stage.VIDEO, Stage.IMAGE)
