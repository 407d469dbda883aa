"""docs/SETTINGS.md is generated from models.settings.Settings: every field described, the file current."""

from __future__ import annotations

import re
from pathlib import Path

from models import settings_doc
from models.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def test_every_setting_has_a_description() -> None:
    missing = [name for name, field in Settings.model_fields.items() if not (field.description or "").strip()]
    assert missing == [], f"Settings fields without Field(description=...): {missing}"


def test_the_settings_reference_is_generated_from_the_class() -> None:
    current = settings_doc.DOC.read_text(encoding="utf-8")
    assert settings_doc.document(current) == current, (
        "docs/SETTINGS.md is stale: run `python -m models.settings_doc --write`"
    )


def test_every_setting_has_a_row_in_the_reference() -> None:
    current = settings_doc.DOC.read_text(encoding="utf-8")
    for name, field in Settings.model_fields.items():
        assert f"| `{settings_doc.env_names(name, field)[0]}`" in current, name


def test_every_genqueue_variable_the_code_names_is_a_setting() -> None:
    """A GENQUEUE_ variable named in the service's code (an os.environ read, a default set for
    the web process) is a Settings field, so it is in the reference."""
    fields = Settings.model_fields.items()
    known = {env for name, field in fields for env in settings_doc.env_names(name, field)}
    named: dict[str, str] = {}
    for folder in ("app", "models", "tasks", "ops", "migrations"):
        for path in (ROOT / folder).rglob("*.py"):
            for var in re.findall(r"\bGENQUEUE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")):
                named.setdefault(var, str(path.relative_to(ROOT)))
    assert {var: where for var, where in named.items() if var not in known} == {}
