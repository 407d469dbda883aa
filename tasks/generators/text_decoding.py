"""Text decoding aids: per-row repetition guards for a left-padded batch, and the sentence-end trim."""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from transformers import LogitsProcessor

# A sentence ends with . ! ? or an ellipsis, maybe followed by closing quotes or brackets.
_SENTENCE_END = re.compile(r"""[.!?\u2026]["'\u201d\u2019)\]]*(?=\s|$)""")
_FINAL_END = re.compile(r"""[.!?\u2026]["'\u201d\u2019)\]]*$""")
_DANGLING = ",;:-\u2013\u2014 \t\n"


class RepetitionGuard(LogitsProcessor):
    """Per-row repetition penalty and n-gram ban over the tokens each row has *generated*.

    transformers' own processors look at all of input_ids, which in a left-padded batch includes
    each row's pad tokens (the pad is often the end-of-text token, so a padded row would be pushed
    away from stopping) and the prompt (penalizing the user's own words). Every row's generated part
    starts at the same column, prompt_len, so slicing there gives each row exactly its own output:
    a row's decisions never depend on its batch-mates.
    """

    def __init__(self, prompt_len: int, penalties: Sequence[float], ngram_sizes: Sequence[int]):
        self.prompt_len = prompt_len
        self.penalties = list(penalties)
        self.ngram_sizes = list(ngram_sizes)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] <= self.prompt_len:
            return scores
        scores = scores.float().clone()  # do not write into the model's logits buffer
        generated = input_ids[:, self.prompt_len :]
        for row, (penalty, n) in enumerate(zip(self.penalties, self.ngram_sizes, strict=True)):
            ids = generated[row]
            if penalty != 1.0:
                seen = torch.unique(ids)
                picked = scores[row, seen]
                # CTRL-style (as transformers does it): shrink positive logits, grow negative ones.
                scores[row, seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
            if n > 0:
                banned = banned_next(ids.tolist(), n)
                if banned:
                    scores[row, banned] = -float("inf")
        return scores


def banned_next(tokens: Sequence[int], n: int) -> list[int]:
    """Tokens that would complete an n-gram already present in `tokens`."""
    if len(tokens) < n:
        return []
    prefix = tuple(tokens[len(tokens) - n + 1 :])
    return sorted(
        {tokens[i + n - 1] for i in range(len(tokens) - n + 1) if tuple(tokens[i : i + n - 1]) == prefix}
    )


def end_at_sentence(text: str, complete: bool) -> str:
    """The text ending at a sentence boundary, never cut mid-phrase, and non-empty if `text` is.

    `complete` says the model stopped by itself (end-of-text): its last words are whole, so at most
    a final full stop is added. A text cut by the token budget is trimmed back to its last sentence
    end; if it has none, back to its last whole word, then closed with a full stop.
    """
    text = text.strip()
    if not text or _ends_sentence(text):
        return text
    if not complete:
        ends = list(_SENTENCE_END.finditer(text))
        if ends:
            return text[: ends[-1].end()]
        if " " in text:
            text = text.rsplit(None, 1)[0]  # the last word may be cut in the middle
    return text.rstrip(_DANGLING) + "." if text.rstrip(_DANGLING) else text


def _ends_sentence(text: str) -> bool:
    return _FINAL_END.search(text) is not None
