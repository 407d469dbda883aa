"""Request models for the API (pydantic v2, strict, no unknown fields) and their error mapping.

Video size is given as separate `width` and `height` integers, not a "WxH" string: each is
validated and reported on its own (`params.width`), and the JSON schema states the rule.
Omitted params are filled from Settings (a random seed is drawn and stored), so a stored
job's params are complete and the job can be reproduced exactly.
"""

from __future__ import annotations

import re
import secrets
import unicodedata
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic_core import PydanticCustomError

from app.body import StorableStr
from app.webhook_schemas import WebhookSubscription
from models.catalog import StageName
from models.job_shots import MAX_SHOTS, MIN_SHOTS
from models.media_links import MAX_IMAGES, OUTPUT_VARIANTS
from models.settings import Settings
from models.usage import parse_time

SEED_MAX = 2**32 - 1
DEFAULT_TEMPERATURE = 0.0  # greedy, as TextRequest defaults
METADATA_MAX_KEYS = 16
METADATA_MAX_CHARS = 256
DEFAULT_SHOTS = 4  # a storyboard's, when params.shots is omitted
PROMPT_MAX_CHARS = 4000  # the documented default; Settings.prompt_max_chars is enforced
_KEEP_CONTROL = {"\n", "\t"}
# Unicode's Cc (control: U+0000-001F, U+007F-009F) and Cs (surrogates: U+D800-DFFF) but for
# _KEEP_CONTROL: one scan in C instead of a category lookup per character (16 us a prompt).
_DROPPED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_STATUS = "(queued|running|succeeded|failed|canceled)"


class Strict(BaseModel):
    # Strict: "256" is not 256 and true is not 1; a typo'd field is an error, not ignored.
    model_config = ConfigDict(extra="forbid", strict=True)


class TextParams(Strict):
    """Parameters of the text stage (every job runs it)."""

    max_new_tokens: int | None = Field(None, ge=1, le=512, description="Default: server setting (64).")
    temperature: float | None = Field(None, ge=0, le=2, description="0 is greedy decoding (the default).")
    seed: int | None = Field(None, ge=0, le=SEED_MAX, description="Default: a random seed, stored.")


class VideoParams(TextParams):
    """Parameters of a video job: the text stage's, plus the video stage's."""

    width: int | None = Field(None, ge=64, le=1024, multiple_of=16, description="Default: 256.")
    height: int | None = Field(None, ge=64, le=1024, multiple_of=16, description="Default: 256.")
    num_frames: int | None = Field(None, ge=1, le=121, description="4k+1 (1, 5, ..., 121). Default: 17.")
    fps: int | None = Field(None, ge=1, le=60, description="Default: 8.")
    steps: int | None = Field(None, ge=1, le=100, description="Denoising steps. Default: 8.")
    allow_degraded: bool | None = Field(None, description="Accept a degraded result. Default: false.")
    variants: list[Any] | None = Field(
        None,
        description="Output variants beside the MP4, made on a CPU queue after the job succeeded "
        "(docs/API.md, Result variants): `webm` (VP9, else AV1), `preview` (animated WebP, <= 2 s, "
        "<= 320 px wide), `upscale` (`upscale_factor` x the size, H.264). Default: none.",
        json_schema_extra={
            "items": {"enum": list(OUTPUT_VARIANTS)}, "uniqueItems": True, "minItems": 1, "maxItems": 3,
        },
    )
    upscale_factor: Literal[2, 4] | None = Field(
        None,
        description="The `upscale` variant's scale; the longest side stays <= upscale_max_side. Default: 2.",
    )

    @field_validator("variants")
    @classmethod
    def _known_variants(cls, v: list[Any] | None, info: ValidationInfo) -> list[Any] | None:
        # One error naming params.variants, whatever is wrong inside the list.
        names = [x for x in v or [] if isinstance(x, str) and x in OUTPUT_VARIANTS]
        if v is not None and (not v or len(names) != len(v) or len(set(names)) != len(v)):
            raise PydanticCustomError(
                "variants",
                "must be a list of unique names from: {names}",
                {"names": ", ".join(OUTPUT_VARIANTS)},
            )
        if v and "upscale" in v:
            _check_upscaled(info, 2)  # the smallest factor: upscale_factor checks a larger one
        return v

    @field_validator("upscale_factor")
    @classmethod
    def _bounded_upscale(cls, v: int | None, info: ValidationInfo) -> int | None:
        # Without `upscale` in params.variants the factor is kept and unused: JSON Schema cannot
        # say "only with upscale", and a schema-valid request must not be a 422.
        if v is not None and "upscale" in (info.data.get("variants") or []):
            _check_upscaled(info, v)
        return v

    @field_validator("num_frames")
    @classmethod
    def _four_k_plus_one(cls, v: int | None) -> int | None:
        if v is not None and (v - 1) % 4:
            raise PydanticCustomError("num_frames", "must be 4k+1 (1, 5, 9, ..., 121)")
        return v


class StoryboardParams(VideoParams):
    """Parameters of a storyboard: its shot count, and the video params every shot renders with."""

    shots: int | None = Field(
        None, ge=MIN_SHOTS, le=MAX_SHOTS, description="Shots in the film, rendered in parallel. Default: 4."
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=512, description="The shot list's token budget. Default: 40 per shot + 24."
    )
    enhance_prompt: bool | None = Field(
        None,
        description="Let the text model write the title and shots (the default); false: the prompt "
        "is split into the shots as written (by sentence or line).",
    )


def _check_upscaled(info: ValidationInfo, factor: int) -> None:
    """The upscaled video's longest side stays within the server's upscale_max_side."""
    settings = (info.context or {}).get("settings")
    if settings is None:
        return
    width = info.data.get("width") or settings.default_width
    side = factor * max(width, info.data.get("height") or settings.default_height)
    if side > settings.upscale_max_side:
        raise PydanticCustomError(
            "upscale_too_large",
            "the upscaled video would be {side} px on its longest side, above {limit}",
            {"side": side, "limit": settings.upscale_max_side},
        )


class ImageParams(TextParams):
    """Parameters of an image job: the text stage's, plus the image stage's."""

    width: int | None = Field(
        None, ge=64, le=2048, multiple_of=32, description="Multiple of 32. Default: server setting (256)."
    )
    height: int | None = Field(
        None, ge=64, le=2048, multiple_of=32, description="Multiple of 32. Default: server setting (256)."
    )
    steps: int | None = Field(None, ge=1, le=100, description="Denoising steps. Default: 8.")
    guidance: float | None = Field(
        None, ge=0, le=20, description="Classifier-free guidance scale. Default: server setting (4.5)."
    )
    num_images: int | None = Field(
        None, ge=1, le=MAX_IMAGES, description="Images rendered from the prompt, one model call. Default: 1."
    )
    enhance_prompt: bool | None = Field(
        None,
        description="Run the text stage to rewrite the prompt as an image prompt (the default); "
        "false: the prompt goes to the image model as written.",
    )
    allow_degraded: bool | None = Field(None, description="Accept a degraded result. Default: false.")


MetaKey = Annotated[StorableStr, StringConstraints(min_length=1, max_length=METADATA_MAX_CHARS)]
MetaValue = Annotated[StorableStr, StringConstraints(max_length=METADATA_MAX_CHARS)]


ModelId = Annotated[str, StringConstraints(min_length=1, max_length=255)]


class JobCreateBase(Strict):
    prompt: str = Field(min_length=1, json_schema_extra={"maxLength": PROMPT_MAX_CHARS})
    priority: Literal["high", "normal", "low"] | None = "normal"
    metadata: dict[MetaKey, MetaValue] | None = Field(None, max_length=METADATA_MAX_KEYS)
    webhook: WebhookSubscription | None = None
    model: ModelId | dict[StageName, ModelId] | None = Field(
        None,
        description="The model to run (an id from GET /v1/models): one id for the stage that makes "
        "the job's output (a video job's video stage, an image job's image stage), or an object "
        "naming a model per stage, e.g. "
        '`{"text": "echo", "video": "wan-tiny"}`. Omitted stages run their default model.',
    )
    cache: bool | None = Field(
        True,
        description="Reuse an identical job's result (same prompt, params with a given seed, models); "
        "false always computes.",
    )

    @field_validator("model", mode="wrap")
    @classmethod
    def _one_model_error(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # The union's members would each report (`model.str`, `model.dict[...]`): one error instead.
        # Which ids exist is app.model_choice's check, against the configured catalog.
        try:
            return handler(v)
        except ValidationError:
            raise PydanticCustomError(
                "model",
                "must be a model id, or an object of stage: model id (stages: {stages})",
                {"stages": ", ".join(get_args(StageName))},
            ) from None

    @field_validator("prompt")
    @classmethod
    def _clean_prompt(cls, v: str, info: ValidationInfo) -> str:
        v = unicodedata.normalize("NFC", v).replace("\r\n", "\n")
        # Cc: control characters (NUL cannot even be stored); Cs: lone surrogates, not encodable.
        v = _DROPPED.sub("", v).strip()
        if not v:
            raise PydanticCustomError("blank", "must not be blank")
        settings = (info.context or {}).get("settings")
        limit = settings.prompt_max_chars if settings else PROMPT_MAX_CHARS
        if len(v) > limit:
            raise PydanticCustomError("too_long", "must be at most {limit} characters", {"limit": limit})
        return v


class TextJobCreate(JobCreateBase):
    """A text job: the prompt becomes text."""

    modality: Literal["text"]
    params: TextParams | None = None


class VideoJobCreate(JobCreateBase):
    """A video job: the prompt becomes a shot description, then an MP4."""

    modality: Literal["video"]
    params: VideoParams | None = None


class ImageJobCreate(JobCreateBase):
    """An image job: the prompt becomes an image prompt (unless `enhance_prompt` is false), then PNGs."""

    modality: Literal["image"]
    params: ImageParams | None = None


class StoryboardJobCreate(JobCreateBase):
    """A storyboard: the prompt becomes a title and `shots` shot descriptions, rendered in parallel
    as clips, then stitched into one MP4 with a contact sheet."""

    modality: Literal["storyboard"]
    params: StoryboardParams | None = None


AnyJobCreate = TextJobCreate | VideoJobCreate | ImageJobCreate | StoryboardJobCreate
JobCreate = Annotated[AnyJobCreate, Field(discriminator="modality")]
job_create_adapter: TypeAdapter[AnyJobCreate] = TypeAdapter(JobCreate)
MODALITIES = ("text", "video", "image", "storyboard")
# Each modality's own params: naming the modality that takes a param the job's does not.
_PARAMS: dict[str, set[str]] = {
    "text": set(TextParams.model_fields),
    "video": set(VideoParams.model_fields),
    "image": set(ImageParams.model_fields),
    "storyboard": set(StoryboardParams.model_fields),
}


def _valid_for(param: str) -> list[str]:
    return [m for m in MODALITIES if param in _PARAMS[m]]


BATCH_MAX = 500  # jobs per POST /v1/jobs/batch


class JobBatchEnvelope(Strict):
    """POST /v1/jobs/batch's body before its jobs are validated, one by one, as POST /v1/jobs's."""

    jobs: list[Any] = Field(min_length=1, max_length=BATCH_MAX)


class JobBatchCreate(JobBatchEnvelope):
    """Up to 500 jobs, each exactly as POST /v1/jobs takes it: all accepted, or none."""

    jobs: list[JobCreate] = Field(  # the envelope's items, typed
        min_length=1, max_length=BATCH_MAX, description="The jobs, answered in this order."
    )


def complete_params(req: AnyJobCreate, settings: Settings) -> dict[str, Any]:
    """The params as stored: every omitted one filled from Settings."""
    given = req.params.model_dump(exclude_none=True) if req.params else {}
    params: dict[str, Any] = {
        "max_new_tokens": settings.default_max_new_tokens,
        "temperature": DEFAULT_TEMPERATURE,
        "seed": secrets.randbelow(SEED_MAX + 1),
    }
    if req.modality in ("video", "storyboard"):
        params |= {
            "width": settings.default_width,
            "height": settings.default_height,
            "num_frames": settings.default_num_frames,
            "fps": settings.default_fps,
            "steps": settings.default_steps,
            "allow_degraded": False,
        }
        if isinstance(req.params, VideoParams) and "upscale" in (req.params.variants or []):
            params["upscale_factor"] = 2  # complete: the upscale variant's default factor
    if req.modality == "storyboard":
        shots = req.params.shots if req.params and req.params.shots else DEFAULT_SHOTS
        params |= {"shots": shots, "max_new_tokens": min(512, 40 * shots + 24), "enhance_prompt": True}
    elif req.modality == "image":
        params |= {
            "width": settings.default_image_width,
            "height": settings.default_image_height,
            "steps": settings.default_steps,
            "guidance": settings.default_image_guidance,
            "num_images": 1,
            "enhance_prompt": True,
            "allow_degraded": False,
        }
    return params | given


def field_errors(exc: ValidationError, body: Any) -> list[dict[str, str]]:
    """pydantic errors as [{field, message}] with dotted field paths such as `params.width`."""
    out = []
    modality = body.get("modality") if isinstance(body, dict) else None
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        if loc and loc[0] in MODALITIES:  # the union's tag, not a field
            loc = loc[1:]
        kind, message = err["type"], err["msg"]
        if loc and loc[-1] == "[key]":  # a bad mapping key: name the mapping, quote the key
            message = f"key {loc[-2][:40]!r}: {message}"
            loc = loc[:-2]
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            loc, message = ["modality"], f"must be one of: {', '.join(MODALITIES)}"
        elif kind == "model_attributes_type" and not loc:
            message = "the body must be a JSON object"
        elif kind == "extra_forbidden":
            message = "unknown field"
            takes = _valid_for(loc[-1]) if loc[:1] == ["params"] and len(loc) == 2 else []
            if takes and modality in MODALITIES:
                names = ", ".join(takes[:-1]) + " and " + takes[-1] if len(takes) > 1 else takes[0]
                message = f"only valid for {names} jobs"
        out.append({"field": ".".join(loc) or "body", "message": message})
    return out


def parse_job(body: Any, settings: Settings) -> AnyJobCreate:
    """Validate a decoded JSON body; raises ValidationError."""
    return job_create_adapter.validate_python(body, context={"settings": settings})


class ListQuery(Strict):
    """Query string of GET /v1/jobs."""

    model_config = ConfigDict(extra="forbid", strict=False)  # query values arrive as strings
    limit: int = Field(20, ge=1, le=100)
    status: str | None = Field(
        None,
        description="One status or a comma-separated list.",
        json_schema_extra={"pattern": f"^{_STATUS}(,{_STATUS})*$"},
    )
    cursor: str | None = Field(None, description="`next_cursor` of the previous page.")


def _iso_datetime(value: Any) -> datetime:
    """ISO 8601 (RFC 3339's lower-case `t`/`z` too); a number is not a time here."""
    if not isinstance(value, str):
        raise PydanticCustomError("datetime", "must be an ISO 8601 date-time")
    try:
        return parse_time(value)
    except ValueError:
        raise PydanticCustomError(
            "datetime", "must be an ISO 8601 date-time, e.g. 2026-12-01T00:00:00Z"
        ) from None


IsoDateTime = Annotated[datetime, BeforeValidator(_iso_datetime)]


class UsageQuery(Strict):
    """Query string of GET /v1/usage (the window's rules: models.usage.window)."""

    model_config = ConfigDict(extra="forbid", strict=False, populate_by_name=False)
    start: IsoDateTime | None = Field(
        None, alias="from", description="Start of the window (inclusive), ISO 8601. Default: `to` - 30 days."
    )
    end: IsoDateTime | None = Field(
        None, alias="to", description="End of the window (exclusive), ISO 8601. Default: now."
    )
    group_by: Literal["day", "model", "modality"] | None = Field(
        None, description="Break the totals down by UTC day of submission, model, or modality."
    )
