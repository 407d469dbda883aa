"""The text model's prompt limit is checked at submit, counted as the worker counts it, without torch.

The web rebuilds SmolLM2's tokenizer from the GGUF with `tokenizers` and renders its chat template
with jinja2 (tasks.contract.prompt_limit); the slow test holds those counts to the worker's own
(transformers' tokenizer and CausalLMGenerator.prompt_ids) on generated prompts and at the boundary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from models import Job
from tasks.contract.prompt_limit import MAX_PROMPT_TOKENS, PromptCounter, counter_for, render

EMOJI = "\U0001f600" * 4000  # the reported case: 4000 characters, 12067 tokens once rendered
# Emoji (3 tokens each) and words: the limit falls inside 4000 characters.
MIXED = "\U0001f98a fox " * 1000


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private model cache, so the first build (from the GGUF) and its cache file are this run's."""
    path = tmp_path_factory.mktemp("prompt-limit-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GENQUEUE_MODEL_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def counter(model_cache: Path) -> PromptCounter:
    found = counter_for("smollm2")
    assert found is not None
    return found


def boundary(counter: PromptCounter) -> tuple[str, str]:
    """(longest prefix of MIXED within the limit, one character longer and over it)."""
    lo, hi = 1, 4000  # count(MIXED[:lo]) <= limit < count(MIXED[:hi])
    assert counter.count(MIXED[:hi]) > MAX_PROMPT_TOKENS
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if counter.count(MIXED[:mid]) <= MAX_PROMPT_TOKENS else (lo, mid)
    return MIXED[:lo].strip(), MIXED[:hi].strip()


@pytest.fixture
def smol_client(settings, sessions, broker, api_key, model_cache):
    from app import create_app
    from tests.support.api import authed_client_class

    # The web never loads the model: only its tokenizer, rebuilt without torch.
    flask_app = create_app(settings.model_copy(update={"text_model": "smollm2"}))
    flask_app.testing = True
    flask_app.test_client_class = authed_client_class(api_key)
    yield flask_app.test_client()
    flask_app.extensions["genqueue"].engine.dispose()


def _jobs(sessions) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(Job)) or 0


def test_a_prompt_over_the_token_limit_is_422_at_submit(smol_client, sessions):
    resp = smol_client.post("/v1/jobs", json={"prompt": EMOJI, "modality": "text"})
    assert resp.status_code == 422, resp.get_data(as_text=True)
    assert resp.mimetype == "application/problem+json"
    (error,) = resp.get_json()["errors"]
    assert error["field"] == "prompt"
    # The worker's own words for this prompt were "prompt is 12067 tokens; the limit is 2048".
    assert error["message"] == f"is 12067 tokens for the text model; the limit is {MAX_PROMPT_TOKENS}"
    assert _jobs(sessions) == 0


@pytest.mark.parametrize("modality", ["text", "video"])  # every job runs the text stage
def test_the_limit_is_exact_at_the_boundary(smol_client, sessions, counter, modality):
    fits, over = boundary(counter)
    assert counter.count(fits) <= MAX_PROMPT_TOKENS < counter.count(over)
    resp = smol_client.post("/v1/jobs", json={"prompt": over, "modality": modality})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["field"] == "prompt"
    assert _jobs(sessions) == 0
    resp = smol_client.post("/v1/jobs", json={"prompt": fits, "modality": modality})
    assert resp.status_code == 202, resp.get_data(as_text=True)


def test_long_prompts_within_the_limit_are_accepted(smol_client, counter):
    prompt = "a red fox runs through deep snow at dawn " * 97  # 3977 characters, ~800 tokens
    assert counter.count(prompt) < MAX_PROMPT_TOKENS
    resp = smol_client.post("/v1/jobs", json={"prompt": prompt, "modality": "text"})
    assert resp.status_code == 202, resp.get_data(as_text=True)


def test_the_counter_is_cached_and_never_imports_torch(model_cache, counter):
    # counter (the fixture) built the cache file; a fresh process reads it, torch-free.
    assert list((model_cache / "prompt-limit").glob("*.json"))
    code = (
        "import sys\n"
        "from app.prompt_check import PromptCheck\n"
        "check = PromptCheck('smollm2')\n"
        f"print(check.error({EMOJI!r}))\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "GENQUEUE_MODEL_CACHE": str(model_cache)},
    ).stdout.splitlines()
    assert out == [f"is 12067 tokens for the text model; the limit is {MAX_PROMPT_TOKENS}", "False False"]


def test_models_without_a_known_tokenizer_are_not_checked(tmp_path):
    assert counter_for("echo") is None
    assert counter_for(str(tmp_path)) is None  # a directory without tokenizer.json


TEMPLATE_BITS = st.sampled_from(["{{ x }}", "{%", "<|im_end|>", "\n"])


@given(prompt=st.lists(st.one_of(st.text(max_size=30), TEMPLATE_BITS), min_size=1, max_size=8).map("".join))
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_the_frame_renders_what_the_template_renders(counter, prompt):
    # The counter puts a prompt between the template's rendered frame instead of rendering it.
    assert counter.frame is not None
    assert counter.rendered(prompt) == render(counter.chat_template, prompt.strip())[0]


@pytest.mark.parametrize("template", [
    "{% for m in messages %}{{ m.content | upper }}{% endfor %}",  # changes the prompt
    "{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}",  # writes it twice
    "{% for m in messages %}{% if 'x' in m.content %}X{% endif %}{{ m.content }}{% endfor %}",  # reads it
])  # fmt: skip
def test_a_template_that_does_more_than_place_the_prompt_is_rendered_each_time(counter, template):
    other = PromptCounter(counter.tokenizer, template)
    assert other.frame is None
    for prompt in ("a fox", "x marks the spot", "  padded  "):
        assert other.rendered(prompt) == render(template, prompt.strip())[0]
        assert other.count(prompt) == len(counter.tokenizer.encode(other.rendered(prompt)).ids)


# --- the worker agrees ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worker_check(model_cache):
    """CausalLMGenerator.prompt_ids with SmolLM2's real tokenizer (transformers, from the GGUF)."""
    from transformers import AutoTokenizer

    from tasks.generators.smollm2 import SmolLM2Generator

    gen = SmolLM2Generator()  # not loaded: only its tokenizer is needed
    path = gen.gguf_path
    gen.tokenizer = AutoTokenizer.from_pretrained(
        str(Path(path).parent), gguf_file=Path(path).name, local_files_only=True
    )
    return gen.prompt_ids


# Any storable text, with the pieces where a rebuilt tokenizer would differ first: special
# tokens written in the prompt, whitespace runs, newlines, digits, accents, CJK, emoji.
PIECES = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cc", "Cs"]), max_size=40),
    st.sampled_from(["<|im_end|>", "<|im_start|>user", "<repo_name>", "\n\n", "\t", "   ", "2025"]),
    st.sampled_from(["e\u0301", "\u72d0\u72f8", "\U0001f98a", "\U0001f468\u200d\U0001f469", "\u00e9t\u00e9"]),
)
PROMPTS = st.lists(PIECES, min_size=1, max_size=12).map("".join).filter(str.strip)


@pytest.mark.slow
@given(prompt=PROMPTS)
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_counts_match_the_worker(worker_check, counter, prompt):
    from tasks.generators.base import TextRequest

    assert counter.count(prompt) == len(worker_check(TextRequest(prompt)))


@pytest.mark.slow
def test_the_worker_draws_the_line_where_the_api_does(worker_check, counter):
    from tasks.generators.base import InvalidRequest, TextRequest

    fits, over = boundary(counter)
    assert len(worker_check(TextRequest(fits))) == counter.count(fits) <= MAX_PROMPT_TOKENS
    with pytest.raises(InvalidRequest, match=f"prompt is {counter.count(over)} tokens"):
        worker_check(TextRequest(over))
    with pytest.raises(InvalidRequest, match="prompt is 12067 tokens"):
        worker_check(TextRequest(EMOJI))
    assert json.loads(counter.tokenizer.to_str())["normalizer"] is None  # the byte bound holds
