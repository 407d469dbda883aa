"""The diffusers upscaler behind the `upscale` variant: a local folder's pipeline, and a tiny random build.

A configured folder (upscale_model_dir, e.g. stable-diffusion-x4-upscaler) is loaded once per
process with local files only. Frames go through it a few at a time, each with the same seeded
noise, so a redelivered task writes the same pixels and neighbouring frames share their noise
pattern (less flicker than fresh noise per frame). `build_tiny_upscaler` is a real
StableDiffusionUpscalePipeline with tiny random weights: tests save it to a folder and configure
that, the same path real weights take; its output is noise, not detail.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DDPMScheduler,
    DiffusionPipeline,
    StableDiffusionUpscalePipeline,
    UNet2DConditionModel,
)
from PIL import Image
from transformers import CLIPTextConfig, CLIPTextModel

from tasks.generators.device import map_oom, pick_device
from tasks.generators.library_logs import quiet_model_libraries
from tasks.generators.wan import byte_tokenizer

log = logging.getLogger(__name__)

NOISE_SEED = 0  # every frame's noise; fixed, so a rerun makes the same file
FRAMES_PER_CALL = 4  # frames per pipeline call: bounds the activations a call holds
WEIGHT_SEED = 20251204
_TOKENS = 16  # the tiny tokenizer's max length (the real CLIP one: 77)


def build_tiny_upscaler() -> StableDiffusionUpscalePipeline:
    """The x4 upscaler's architecture (7-channel UNet on the low-res image, 4x VAE) in miniature."""
    tokenizer = byte_tokenizer()
    tokenizer.model_max_length = _TOKENS
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(WEIGHT_SEED)
        unet = UNet2DConditionModel(
            sample_size=16,
            in_channels=7,  # 4 latent channels + the 3 of the low-res image
            out_channels=4,
            block_out_channels=(8, 16),
            layers_per_block=1,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=8,
            attention_head_dim=4,
            norm_num_groups=4,
            use_linear_projection=True,
            num_class_embeds=351,  # one per noise level, max_noise_level 350
        )
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            block_out_channels=(4, 4, 4),  # three blocks: the decoder's 4x
            down_block_types=("DownEncoderBlock2D",) * 3,
            up_block_types=("UpDecoderBlock2D",) * 3,
            latent_channels=4,
            norm_num_groups=2,
            scaling_factor=0.08333,  # the x4 upscaler's
        )
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=len(tokenizer),
                hidden_size=8,
                intermediate_size=16,
                num_attention_heads=2,
                num_hidden_layers=1,
                max_position_embeddings=_TOKENS,
                projection_dim=8,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=1,
            )
        )
    return StableDiffusionUpscalePipeline(
        vae=vae.eval(),  # type: ignore[attr-defined]  # mypy finds no nn.Module.eval on diffusers models
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        unet=unet.eval(),  # type: ignore[attr-defined]
        low_res_scheduler=DDPMScheduler(),
        scheduler=DDIMScheduler(prediction_type="v_prediction"),
        max_noise_level=350,
    )


@functools.lru_cache(maxsize=1)
def load(model_dir: str) -> Any:
    """The folder's pipeline on CUDA when present (its half precision there), else the CPU."""
    quiet_model_libraries()
    device, dtype = pick_device()
    log.info("loading the upscaler from %s on %s", model_dir, device)
    pipe = DiffusionPipeline.from_pretrained(model_dir, local_files_only=True, torch_dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


def upscale(frames: np.ndarray, prompt: str, model_dir: str, steps: int) -> np.ndarray:
    """uint8 (F, H, W, 3) frames through the folder's upscaler (its own factor, x4 for SD's), with
    `prompt` (what the video shows) as its text condition; uint8 frames back."""
    pipe = load(model_dir)
    out: list[np.ndarray] = []
    for start in range(0, len(frames), FRAMES_PER_CALL):
        chunk = [Image.fromarray(f) for f in frames[start : start + FRAMES_PER_CALL]]
        noise = [torch.Generator("cpu").manual_seed(NOISE_SEED) for _ in chunk]
        with map_oom(), torch.inference_mode():
            images = pipe(
                prompt=[prompt] * len(chunk), image=chunk, num_inference_steps=steps, generator=noise,
                output_type="np",
            ).images  # fmt: skip
        out.extend((np.clip(images, 0.0, 1.0) * 255).round().astype(np.uint8))
    return np.stack(out)
