"""Built-in image model "sana-tiny": a real diffusers SanaPipeline with tiny random weights (a wiring model).

It runs the whole Sana code path (Gemma2 text encoder, linear-attention DiT, flow-matching scheduler,
the 32x DC-AE autoencoder, step callbacks, per-image seeds) in well under a second on a CPU; its
output is coloured noise, not a picture of the prompt. The weights come from a fixed torch seed,
so every process builds the identical model and the same request gives the same pixels. The
tokenizer is Wan's byte-level one, built in code: nothing is downloaded. Point
GENQUEUE_IMAGE_MODEL at a local Sana_600M_1024px_diffusers (or any diffusers text-to-image folder)
for real images.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
from transformers import Gemma2Config, Gemma2Model

from tasks.generators.diffusers_image import DiffusersImageGenerator
from tasks.generators.wan import byte_tokenizer

WEIGHT_SEED = 20251202
LATENT = 4  # latent channels: the DC-AE's and the transformer's in/out channels must agree
CAPTION = 8  # Gemma2 hidden size, which the transformer's caption_channels must match
_BLOCKS = 6  # six DC-AE stages: 2**5 = 32x downscale, as in the real Sana autoencoder


def build_tiny_sana() -> SanaPipeline:
    """Assemble the tiny pipeline on the CPU in float32 with seeded weights, leaving the global RNG alone."""
    tokenizer = byte_tokenizer()
    res, vit = ("ResBlock",) * 4, ("EfficientViTBlock",) * 2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(WEIGHT_SEED)
        vae = AutoencoderDC(
            in_channels=3,
            latent_channels=LATENT,
            attention_head_dim=2,
            encoder_block_types=res + vit,
            decoder_block_types=res + vit,
            encoder_block_out_channels=(8,) * _BLOCKS,
            decoder_block_out_channels=(8,) * _BLOCKS,
            encoder_qkv_multiscales=((),) * 4 + ((5,),) * 2,
            decoder_qkv_multiscales=((),) * 4 + ((5,),) * 2,
            encoder_layers_per_block=(1,) * _BLOCKS,
            decoder_layers_per_block=(1,) * _BLOCKS,
            downsample_block_type="conv",
            upsample_block_type="interpolate",
            decoder_norm_types="rms_norm",
            decoder_act_fns="silu",
            scaling_factor=0.41407,
        )
        transformer = SanaTransformer2DModel(
            patch_size=1,
            in_channels=LATENT,
            out_channels=LATENT,
            num_layers=1,
            num_attention_heads=2,
            attention_head_dim=4,
            num_cross_attention_heads=2,
            cross_attention_head_dim=4,
            cross_attention_dim=8,
            caption_channels=CAPTION,
            sample_size=32,
        )
        text_encoder = Gemma2Model(
            Gemma2Config(  # type: ignore[call-arg]  # attn_implementation: a PretrainedConfig kwarg
                vocab_size=len(tokenizer),
                hidden_size=CAPTION,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=16,
                max_position_embeddings=8192,
                pad_token_id=0,
                eos_token_id=1,
                bos_token_id=1,
                attn_implementation="eager",
            )
        )
    return SanaPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder.eval(),
        # mypy finds no nn.Module.eval on diffusers' model classes.
        transformer=transformer.eval(),  # type: ignore[attr-defined]
        vae=vae.eval(),  # type: ignore[attr-defined]
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )


class TinySanaGenerator(DiffusersImageGenerator):
    """Random-weight Sana for wiring tests and CPU-only deployments; see the module docstring."""

    # Sana's default "complex human instruction" prefixes ~1000 bytes to every prompt for its Gemma
    # encoder: most of the tiny model's CPU time, and random weights cannot use it. The text stage
    # already enhances the prompt; a real Sana folder keeps the pipeline's default.
    call_kwargs: ClassVar[dict[str, Any]] = {"complex_human_instruction": None}

    def __init__(self) -> None:
        super().__init__(None)
        self.name = "sana-tiny"
        self.version = f"sana-tiny-random-v1@seed{WEIGHT_SEED}"

    def _build_pipeline(self) -> Any:
        pipe: Any = build_tiny_sana()
        if self.dtype != torch.float32:
            pipe.to(dtype=self.dtype)
        return pipe
