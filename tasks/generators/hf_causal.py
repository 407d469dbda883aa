"""Generic adapter for a local transformers causal-LM directory: batched, seedable, cancellable."""

from __future__ import annotations

import functools
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

# The limit and the system prompt are shared with the API, which checks prompts at submit.
from tasks.contract.prompt_limit import MAX_PROMPT_TOKENS, SYSTEM_PROMPT
from tasks.generators.base import (
    CancelCheck,
    Canceled,
    InvalidRequest,
    StepCallback,
    TextGenerator,
    TextRequest,
    TextResult,
)
from tasks.generators.device import dir_version, map_oom, pick_device
from tasks.generators.library_logs import quiet_model_libraries
from tasks.generators.text_decoding import RepetitionGuard, end_at_sentence

log = logging.getLogger(__name__)


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


class StepReport(StoppingCriteria):
    """Never stops anything: after each generated token, tells on_step how far each row is."""

    def __init__(self, on_step: StepCallback, prompt_len: int, budgets: Sequence[int]):
        self.on_step, self.prompt_len, self.budgets = on_step, prompt_len, budgets

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        done = input_ids.shape[1] - self.prompt_len
        for row, budget in enumerate(self.budgets):
            self.on_step(row, min(done, budget), budget)  # the caller throttles (tasks.watch)
        return torch.zeros(  # type: ignore[return-value]  # see RowBudget
            (input_ids.shape[0],), dtype=torch.bool, device=input_ids.device
        )


class CausalLMGenerator(TextGenerator):
    """Any local transformers causal LM, used to expand a user's idea into a shot description."""

    system_prompt = SYSTEM_PROMPT
    max_prompt_tokens = MAX_PROMPT_TOKENS
    cancel_check_interval_s = 0.2

    def __init__(self, path: str, dtype: str = "auto"):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self.version = dir_version(path, "config.json")
        self.device, self.dtype = pick_device(dtype)
        self.model: Any = None
        self.tokenizer: Any = None
        self._eos_ids: list[int] = []
        # check_inputs tokenizes to count; run_batch needs the same ids a moment later.
        self._encode = functools.lru_cache(maxsize=64)(self._encode_uncached)

    # -- loading ---------------------------------------------------------------------------------
    def _load_model_and_tokenizer(self) -> tuple[Any, Any]:
        """Subclasses override this to load from elsewhere (GGUF, a cache); the rest is shared."""
        tok = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True, dtype=self.dtype)
        return model, tok

    def load(self) -> None:
        quiet_model_libraries()  # no loading bars in the logs
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
    def _render(self, prompt: str, system_prompt: str | None = None) -> tuple[str, bool]:
        """Chat-formatted text and whether the tokenizer should still add its special tokens."""
        tok, system = self.tokenizer, system_prompt or self.system_prompt
        if not tok.chat_template:
            return f"{system}\n\nIdea: {prompt}\nShot:", True
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        try:
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), False
        except Exception:  # some templates reject a system turn; fold it into the user turn
            merged = [{"role": "user", "content": f"{system}\n\n{prompt}"}]
            return tok.apply_chat_template(merged, tokenize=False, add_generation_prompt=True), False

    def _encode_uncached(self, prompt: str, system_prompt: str | None = None) -> tuple[int, ...]:
        text, special = self._render(prompt.strip(), system_prompt)
        return tuple(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def prompt_ids(self, req: TextRequest) -> list[int]:
        """Token ids of the rendered prompt; raises InvalidRequest for requests we will not run."""
        super().check_inputs(req)  # prompt, max_new_tokens, temperature
        ids = self._encode(req.prompt, req.system_prompt)
        if len(ids) > self.max_prompt_tokens:
            raise InvalidRequest(f"prompt is {len(ids)} tokens; the limit is {self.max_prompt_tokens}")
        return list(ids)

    def check_inputs(self, request: TextRequest) -> None:
        self.prompt_ids(request)

    def ready(self) -> bool:
        return self.model is not None

    def run_batch(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        """Run the checked requests in one left-padded generate() call.

        Each result's `seconds` is the wall time of the shared batched call.
        """
        rows = [(req, self.prompt_ids(req)) for req in requests]
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
        guard = RepetitionGuard(
            prompt_len, [r.repetition_penalty for r, _ in rows], [r.no_repeat_ngram_size for r, _ in rows]
        )
        cancel = CancelCriteria(should_cancel, self.cancel_check_interval_s)
        criteria: list[StoppingCriteria] = [RowBudget(prompt_len, budgets), cancel]
        if on_step is not None:
            criteria.append(StepReport(on_step, prompt_len, budgets))
        # A fresh config so checkpoint defaults (sampling, penalties) never leak in; penalties and
        # sampling are done by RepetitionGuard and PerRowSampler inside greedy decoding, so they
        # stay per row (the guard first: a banned token must stay banned after the noise).
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
                logits_processor=LogitsProcessorList(
                    [guard, PerRowSampler([r.temperature for r, _ in rows], gens)]
                ),
                stopping_criteria=StoppingCriteriaList(criteria),
            )
        if cancel.canceled:
            raise Canceled("text generation canceled")
        seconds = time.perf_counter() - started
        results = []
        eos = set(self._eos_ids)
        for row, budget in zip(out[:, prompt_len:].tolist(), budgets, strict=True):
            row = row[:budget]
            cut = next((i for i, t in enumerate(row) if t in eos), len(row))
            # A row cut by its budget may stop mid-phrase: end it at its last whole sentence.
            text = end_at_sentence(tok.decode(row[:cut], skip_special_tokens=True), cut < len(row))
            results.append(TextResult(text=text, tokens=cut, seconds=seconds))
        return results
