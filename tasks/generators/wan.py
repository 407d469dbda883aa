"""Built-in video model "wan-tiny": a real diffusers WanPipeline with tiny random weights (a wiring model).

It exercises the whole Wan code path (text encoder, 3-D transformer, flow-matching scheduler, causal
VAE, callbacks, seeds) in about two seconds on a CPU, and its output is coloured noise, not a
picture of the prompt. The weights come from a fixed torch seed, so every process builds the
identical model and the same request gives the same frames. Nothing is downloaded.
"""
from __future__ import annotations

from typing import Any

import torch
from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

from tasks.generators.diffusers_video import DiffusersVideoGenerator

WEIGHT_SEED = 20250101
Z_DIM = 4  # latent channels: the VAE's z_dim and the transformer's in/out channels must agree
TEXT_DIM = 32  # UMT5 d_model, which the transformer's text_dim must match


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer built in code: ids 0-2 are <pad>, </s>, <unk> (T5's layout), then 256 bytes."""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # T5-style encoders expect every sequence to end with </s>.
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    specials = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    return PreTrainedTokenizerFast(tokenizer_object=tok, **specials)


def build_tiny_wan() -> WanPipeline:
    """Assemble the tiny pipeline on the CPU in float32 with seeded weights, leaving the global RNG alone."""
    tokenizer = byte_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(WEIGHT_SEED)
        vae = AutoencoderKLWan(
            base_dim=3,
            z_dim=Z_DIM,
            dim_mult=[1, 1, 1, 1],  # three 2x downsamples -> 8x spatial, as in the real VAE
            num_res_blocks=1,
            temperal_downsample=[False, True, True],  # 4x temporal -> num_frames = 4k + 1
            latents_mean=[0.0] * Z_DIM,
            latents_std=[1.0] * Z_DIM,
        )
        text_encoder = UMT5EncoderModel(
            UMT5Config(
                vocab_size=len(tokenizer),
                d_model=TEXT_DIM,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                pad_token_id=0,
                eos_token_id=1,
                decoder_start_token_id=0,
            )
        )
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=Z_DIM,
            out_channels=Z_DIM,
            text_dim=TEXT_DIM,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        )
    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder.eval(),
        # mypy finds no nn.Module.eval on diffusers' model classes.
        transformer=transformer.eval(),  # type: ignore[attr-defined]
        vae=vae.eval(),  # type: ignore[attr-defined]
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),  # Wan's default flow shift
    )


def cast_keeping_fp32(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast to `dtype` but leave the model's _keep_in_fp32_modules (norms, time embedding) in float32,
    as from_pretrained(torch_dtype=...) would; diffusers' own .to(dtype) casts everything."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point():
            tensor.data = tensor.data.to(torch.float32 if any(k in name for k in keep) else dtype)


class TinyWanGenerator(DiffusersVideoGenerator):
    """Random-weight Wan for wiring tests and CPU-only deployments; see the module docstring."""

    def __init__(self) -> None:
        super().__init__(None)
        self.name = "wan-tiny"
        self.version = f"wan-tiny-random-v1@seed{WEIGHT_SEED}"

    def _build_pipeline(self) -> Any:
        pipe: Any = build_tiny_wan()  # its components are set by register_modules, unseen by mypy
        if self.dtype != torch.float32:
            pipe.text_encoder.to(self.dtype)
            cast_keeping_fp32(pipe.transformer, self.dtype)
        return pipe  # the VAE stays float32, as load() arranges for every Wan pipeline
