"""Generic adapter for a local transformers causal-LM directory: batched, seedable, cancellable."""
from __future__ import annotations

import logging
import math
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from tasks.generators.base import CancelCheck, Canceled, InvalidRequest, TextRequest, TextResult
from tasks.generators.device import dir_version, map_oom, pick_device

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You write prompts for a text-to-video model. Rewrite the user's idea as one short, concrete "
    "paragraph describing a single shot: the subject, what it does, the setting, the lighting and "
    "the camera movement. Reply with that paragraph only."
)


class PerRowSampler(LogitsProcessor):
    """Per-row temperature plus seeded Gumbel noise, applied inside a *greedy* generate() call.

    argmax(logits / T + Gumbel) is an exact sample from softmax(logits / T), so one batched greedy
    call can mix greedy rows (T == 0, left untouched) with sampled rows that each draw from their
    own torch.Generator. Every row draws once per step, so a row's k-th token always uses its
    generator's k-th draw: the same seed gives the same text whatever the batch-mates (up to the
    tiny numeric differences left padding can cause).
    """

    def __init__(self, temperatures: Sequence[float], generators: Sequence[torch.Generator | None]):
        self.temperatures = list(temperatures)
        self.generators = list(generators)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float()  # bf16 logits would make the noise coarse
        for row, (temp, gen) in enumerate(zip(self.temperatures, self.generators, strict=True)):
            if temp <= 0 or gen is None:
                continue
            expo = torch.empty(scores.shape[-1], device=scores.device).exponential_(generator=gen)
            scores[row] = scores[row] / temp - expo.log()  # -log(Exp(1)) is Gumbel(0, 1)
        return scores


class RowBudget(StoppingCriteria):
    """Stops each row at its own max_new_tokens so short requests do not ride the longest one."""

    def __init__(self, prompt_len: int, budgets: Sequence[int]):
        self.limits = torch.tensor([prompt_len + b for b in budgets])

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        # transformers declares BoolTensor, a type no torch operation returns: a bool Tensor is meant.
        return input_ids.shape[1] >= self.limits.to(input_ids.device)  # type: ignore[return-value]


class CancelCriteria(StoppingCriteria):
    """Polls should_cancel between tokens (throttled, since it may hit the database) and stops all rows."""

    def __init__(self, should_cancel: CancelCheck | None, interval_s: float):
        self.should_cancel = should_cancel
        self.interval_s = interval_s
        self.canceled = False
        self._last = -math.inf

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        now = time.monotonic()
        if self.should_cancel is not None and not self.canceled and now - self._last >= self.interval_s:
            self._last = now
            self.canceled = bool(self.should_cancel())
        return torch.full(  # type: ignore[return-value]  # see RowBudget
            (input_ids.shape[0],), self.canceled, dtype=torch.bool, device=input_ids.device
        )


class CausalLMGenerator:
    """Any local transformers causal LM, used to expand a user's idea into a shot description."""

    system_prompt = SYSTEM_PROMPT
    max_new_tokens_limit = 1024
    max_prompt_tokens = 2048
    cancel_check_interval_s = 0.2

    def __init__(self, path: str, dtype: str = "auto"):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self.version = dir_version(path, "config.json")
        self.device, self.dtype = pick_device(dtype)
        self.model: Any = None
        self.tokenizer: Any = None
        self._eos_ids: list[int] = []

    # -- loading ---------------------------------------------------------------------------------
    def _load_model_and_tokenizer(self) -> tuple[Any, Any]:
        """Subclasses override this to load from elsewhere (GGUF, a cache); the rest is shared."""
        tok = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True, dtype=self.dtype)
        return model, tok

    def load(self) -> None:
        model, tok = self._load_model_and_tokenizer()
        tok.padding_side = "left"  # decoder-only models continue from the right edge
        if tok.pad_token_id is None:
            if tok.eos_token_id is None:
                raise ValueError(f"{self.path}: tokenizer has neither a pad nor an eos token")
            tok.pad_token = tok.eos_token
        self.model = model.to(self.device, dtype=self.dtype).eval()
        self.tokenizer = tok
        eos = model.generation_config.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [eos]
        self._eos_ids = sorted({i for i in [*eos_ids, tok.eos_token_id] if i is not None})
        # Warm-up: first call pays for kernel selection/allocations, not the first job.
        self.generate([TextRequest("a cat", max_new_tokens=2)])

    # -- generation ------------------------------------------------------------------------------
    def _render(self, prompt: str) -> tuple[str, bool]:
        """Chat-formatted text and whether the tokenizer should still add its special tokens."""
        tok = self.tokenizer
        if not tok.chat_template:
            return f"{self.system_prompt}\n\nIdea: {prompt}\nShot:", True
        msgs = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": prompt}]
        try:
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), False
        except Exception:  # some templates reject a system turn; fold it into the user turn
            merged = [{"role": "user", "content": f"{self.system_prompt}\n\n{prompt}"}]
            return tok.apply_chat_template(merged, tokenize=False, add_generation_prompt=True), False

    def _check(self, req: TextRequest) -> list[int]:
        """Token ids of the rendered prompt; raises InvalidRequest for requests we will not run."""
        if not isinstance(req.prompt, str) or not req.prompt.strip():
            raise InvalidRequest("prompt is empty")
        if not 1 <= req.max_new_tokens <= self.max_new_tokens_limit:
            raise InvalidRequest(f"max_new_tokens must be between 1 and {self.max_new_tokens_limit}")
        if not (req.temperature >= 0 and math.isfinite(req.temperature)):
            raise InvalidRequest("temperature must be a finite number >= 0")
        text, special = self._render(req.prompt.strip())
        ids: list[int] = self.tokenizer(text, add_special_tokens=special)["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            raise InvalidRequest(f"prompt is {len(ids)} tokens; the limit is {self.max_prompt_tokens}")
        return ids

    def generate(
        self, requests: Sequence[TextRequest], should_cancel: CancelCheck | None = None
    ) -> list[TextResult]:
        """Run every valid request in one left-padded generate() call; invalid ones fail alone.

        Each result's `seconds` is the wall time of the shared batched call.
        """
        if self.model is None:
            raise RuntimeError("load() must be called before generate()")
        results: list[TextResult | None] = [None] * len(requests)
        rows: list[tuple[int, TextRequest, list[int]]] = []
        for idx, req in enumerate(requests):
            try:
                rows.append((idx, req, self._check(req)))
            except InvalidRequest as exc:
                results[idx] = TextResult(text="", tokens=0, seconds=0.0, error=exc)
        if rows:
            done = self._run_batch([(r, ids) for _, r, ids in rows], should_cancel)
            for (idx, _, _), res in zip(rows, done, strict=True):
                results[idx] = res
        return [r for r in results if r is not None]

    def _run_batch(
        self, rows: Sequence[tuple[TextRequest, list[int]]], should_cancel: CancelCheck | None
    ) -> list[TextResult]:
        tok, started = self.tokenizer, time.perf_counter()
        batch = tok.pad({"input_ids": [ids for _, ids in rows]}, padding=True, return_tensors="pt")
        input_ids = batch["input_ids"].to(self.device)
        attention_mask = batch["attention_mask"].to(self.device)
        prompt_len = input_ids.shape[1]
        budgets = [r.max_new_tokens for r, _ in rows]
        gens: list[torch.Generator | None] = []
        for req, _ in rows:
            if req.temperature > 0:
                seed = req.seed if req.seed is not None else secrets.randbits(63)
                gens.append(torch.Generator(device=self.device).manual_seed(seed))
            else:
                gens.append(None)
        cancel = CancelCriteria(should_cancel, self.cancel_check_interval_s)
        # A fresh config so checkpoint defaults (sampling, penalties) never leak in; sampling is
        # done by PerRowSampler inside greedy decoding, so temperature/seed stay per row.
        config = GenerationConfig(
            max_new_tokens=max(budgets),
            do_sample=False,
            num_beams=1,
            pad_token_id=tok.pad_token_id,
            eos_token_id=self._eos_ids,
        )
        with map_oom(), torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=LogitsProcessorList([PerRowSampler([r.temperature for r, _ in rows], gens)]),
                stopping_criteria=StoppingCriteriaList([RowBudget(prompt_len, budgets), cancel]),
            )
        if cancel.canceled:
            raise Canceled("text generation canceled")
        seconds = time.perf_counter() - started
        results = []
        eos = set(self._eos_ids)
        for row, budget in zip(out[:, prompt_len:].tolist(), budgets, strict=True):
            row = row[:budget]
            cut = next((i for i, t in enumerate(row) if t in eos), len(row))
            text = tok.decode(row[:cut], skip_special_tokens=True).strip()
            results.append(TextResult(text=text, tokens=cut, seconds=seconds))
        return results
