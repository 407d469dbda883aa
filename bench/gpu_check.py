"""One-shot CUDA checks of the generator adapters on a GPU machine; prints one JSON line per finding.

    PYTHONPATH=$PWD python bench/gpu_check.py [--smol-config .whl/smol_cfg]

What it checks, in order:
  device   pick_device() chooses cuda (bf16 where supported);
  oom      a 400 GiB allocation under map_oom() raises the adapters' OutOfMemory (retryable),
           and the memory is freed afterwards;
  text     SmolLM2-135M's real architecture and tokenizer (config.json + tokenizer files in
           --smol-config) with random weights, saved as a model folder and run through the generic
           CausalLMGenerator: 8 prompts x 48 tokens one by one vs one batched call (twice); a
           per-request seed gives the same text inside a batch as alone; cancel raises Canceled;
  video    the tiny Wan pipeline (256x256, 17 frames, 8 steps) three times, a batch of 4, a batched
           item vs the same request alone, cancel, and the generic diffusers folder adapter.
Random weights, because the real weights are not available on such a machine: the timings are
those of the real architecture, the texts are not meaningful.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

PROMPTS = [
    "a cat surfing a wave at sunset",
    "rain on a neon street in Tokyo",
    "an astronaut planting a tree on the moon",
    "a paper boat drifting down a gutter",
    "an old man feeding pigeons",
    "a fox running through fresh snow",
    "a hot air balloon over a canyon",
    "a robot making pancakes",
]


def log(**fields: Any) -> None:
    print(json.dumps(fields, default=str), flush=True)


def check_device_and_oom() -> None:
    import torch

    from tasks.generators.base import OutOfMemory
    from tasks.generators.device import map_oom, pick_device

    log(device=pick_device(), gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    try:
        with map_oom():
            torch.empty(400 * 2**30, dtype=torch.uint8, device="cuda")
        log(oom="NOT RAISED")
    except OutOfMemory as exc:
        freed = torch.cuda.memory_allocated()
        log(oom_mapped=True, retryable=exc.retryable, msg=str(exc)[:90], allocated=freed)


def check_text(smol_config: str, model_dir: str = "/tmp/smol_random") -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tasks.generators.base import Canceled, TextRequest
    from tasks.generators.hf_causal import CausalLMGenerator

    shutil.copytree(smol_config, model_dir, dirs_exist_ok=True)  # config + tokenizer files
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(smol_config)).save_pretrained(model_dir)
    started = time.perf_counter()
    gen = CausalLMGenerator(model_dir)
    gen.load()
    log(lm_load_s=round(time.perf_counter() - started, 2), dtype=gen.model.dtype, dev=str(gen.model.device))

    reqs = [TextRequest(p, max_new_tokens=48) for p in PROMPTS]
    for _ in range(2):
        started = time.perf_counter()
        one = [gen.generate([r])[0] for r in reqs]
        one_s = time.perf_counter() - started
        started = time.perf_counter()
        batched = gen.generate(reqs)
        batched_s = time.perf_counter() - started
        log(
            one_by_one_s=round(one_s, 3),
            batched_s=round(batched_s, 3),
            ratio=round(one_s / batched_s, 2),
            tok_one=sum(r.tokens for r in one),
            tok_bat=sum(r.tokens for r in batched),
        )

    seeded = TextRequest("a fox", max_new_tokens=20, temperature=0.9, seed=11)
    alone = gen.generate([seeded])[0].text
    mixed = gen.generate(
        [TextRequest("a much longer prompt about many things", max_new_tokens=5), seeded, TextRequest("")]
    )
    other = gen.generate([TextRequest("a fox", max_new_tokens=20, temperature=0.9, seed=12)])[0].text
    log(
        seed_same_in_batch=alone == mixed[1].text,
        empty_err=repr(mixed[2].error),
        other_seed_differs=other != alone,
    )

    gen.cancel_check_interval_s = 0
    try:
        gen.generate([TextRequest("x", max_new_tokens=40)], should_cancel=lambda: True)
        log(lm_cancel="NOT RAISED")
    except Canceled:
        log(lm_cancel="ok")
    del gen
    torch.cuda.empty_cache()


def check_video(folder: str = "/tmp/tinywan_dir") -> None:
    from tasks.generators.base import Canceled, VideoRequest
    from tasks.generators.diffusers_video import DiffusersVideoGenerator
    from tasks.generators.wan import TinyWanGenerator, build_tiny_wan

    started = time.perf_counter()
    wan = TinyWanGenerator()
    wan.load()
    log(wan_load_s=round(time.perf_counter() - started, 2))
    pipe = wan.pipe
    log(
        transformer_dtypes=sorted({str(p.dtype) for p in pipe.transformer.parameters()}),
        vae=str(pipe.vae.dtype),
        te=str(pipe.text_encoder.dtype),
    )
    for rep in range(3):
        steps: list[tuple[Any, ...]] = []

        def on_step(*step: Any, seen: list[tuple[Any, ...]] = steps) -> None:
            seen.append(step)

        started = time.perf_counter()
        result = wan.generate([VideoRequest("a red fox running", seed=rep)], on_step=on_step)[0]
        log(
            wan_256x256x17x8_s=round(time.perf_counter() - started, 3),
            shape=result.frames.shape,
            steps=len(steps),
            mean=float(result.frames.mean()),
        )
    started = time.perf_counter()
    batch = wan.generate([VideoRequest(f"p{i}", seed=i) for i in range(4)])
    log(wan_batch4_s=round(time.perf_counter() - started, 3), shapes={x.frames.shape for x in batch})
    single = wan.generate([VideoRequest("p1", seed=1)])[0].frames.astype(int)
    log(batch_vs_single_maxdiff=int(abs(single - batch[1].frames.astype(int)).max()))

    checks = [0]

    def cancel_on_third() -> bool:
        checks[0] += 1
        return checks[0] >= 3

    try:
        wan.generate([VideoRequest("x", steps=8)], should_cancel=cancel_on_third)
        log(wan_cancel="NOT RAISED")
    except Canceled:
        log(wan_cancel="ok", checks=checks[0])

    build_tiny_wan().save_pretrained(folder)
    generic = DiffusersVideoGenerator(folder)
    generic.load()
    result = generic.generate([VideoRequest("x", width=64, height=32, num_frames=9, steps=4, seed=0)])[0]
    log(
        folder_shape=result.frames.shape,
        folder_vae=str(generic.pipe.vae.dtype),
        folder_tr=str(generic.pipe.transformer.dtype),
        version=generic.version,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smol-config", default=".whl/smol_cfg", help="folder with SmolLM2-135M's config.json and tokenizer"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    check_device_and_oom()
    check_text(args.smol_config)
    check_video()
    log(max_mem_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))


if __name__ == "__main__":
    main()
