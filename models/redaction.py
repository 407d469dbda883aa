"""Secrets never reach the logs: API keys, bearer tokens, webhook secrets, URL passwords are masked.

Installed as the log record factory, so it covers every logger and every handler (Celery's,
gunicorn's, pytest's) in the process: each record's message, and its traceback text, is
rendered once and masked before any handler sees it.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any

_PATTERNS = [
    # API keys: keep the visible prefix, which is how operators name a key.
    (re.compile(r"\b(gq_[a-z0-9]{8})_[A-Za-z0-9_-]{8,}"), r"\1_***"),
    (re.compile(r"(?i)\b(bearer\s+)[^\s,;'\"]+"), r"\1***"),
    (re.compile(r"\bwhsec_[A-Za-z0-9+/=_-]+"), "whsec_***"),
    # scheme://user:password@host -> scheme://user:***@host (database, broker, Redis URLs)
    (re.compile(r"\b([a-z][a-z0-9+.-]*://[^:/?#@\s]*:)[^@/\s]+@", re.I), r"\1***@"),
    (re.compile(r"(?i)\b(password|passwd|pwd|secret|api[_-]?key)(\s*[=:]\s*)[^\s,;&'\"]+"), r"\1\2***"),
]


# What each pattern above needs in the text (lower-cased) to match: a string holding none of these
# is returned as it is, without five substitutions (a JSON log line masks each of its strings).
_NEEDED = ("gq_", "bearer", "whsec_", "://", "passw", "pwd", "secret", "apikey", "api_key", "api-key")


def redact(text: str) -> str:
    low = text.lower()
    if not any(word in low for word in _NEEDED):
        return text
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


_installed = False


def install() -> None:
    """Mask secrets in every log record created from now on in this process (idempotent)."""
    global _installed
    if _installed:
        return
    base = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = base(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the handler report it as usual
            return record
        record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        return record

    logging.setLogRecordFactory(factory)
    _installed = True
