"""Tenant plans: per-tenant limits on what a job may ask for and how long its results live."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from limits import parse_many
from sqlalchemy import select
from sqlalchemy.orm import Session

from models.settings import Settings
from models.tenant import Tenant

PRIORITY_RANK = {"low": 0, "normal": 1, "high": 2}


@dataclass(frozen=True)
class Violation:
    """One limit a job goes beyond: the request field, the plan limit's name, its value."""

    field: str
    limit: str
    allowed: Any
    asked: Any

    @property
    def message(self) -> str:
        return f"{self.asked!r} is beyond the plan limit {self.limit}={self.allowed!r}"


_EFFECTIVE_MAX = 4096  # remembered effective plans (one per settings object and distinct overrides)
_EFFECTIVE: dict[tuple[int, tuple[tuple[str, Any], ...]], tuple[Settings, Plan]] = {}


@dataclass(frozen=True)
class Plan:
    rate_limit: str  # per API key, in the limits library's notation: "100/second;3000/minute"
    max_active_jobs: int  # queued + running jobs per tenant
    max_width: int
    max_height: int
    max_frames: int
    max_steps: int
    max_priority: str  # the highest priority the tenant may ask for
    max_prompt_chars: int
    retention_s: int  # how long a finished job's outputs are kept (0: forever)
    media_url_ttl_s: int  # how long a signed link to a job's content stays valid
    allowed_models: str  # comma-separated model ids, "stage:id" for one stage's; "": every model

    @classmethod
    def default(cls, settings: Settings) -> Plan:
        return cls(**{f.name: getattr(settings, _setting(f.name)) for f in dataclasses.fields(cls)})

    @classmethod
    def effective(cls, settings: Settings, overrides: dict[str, Any] | None) -> Plan:
        """The configured default plan with a tenant's stored overrides applied.

        Remembered per settings object and overrides (a request asked for it two or three times,
        each built from every plan setting: about 4% of a submit's web CPU). Settings are not
        changed in place once a process runs; a changed one is a new object (model_copy).
        """
        known = tuple(sorted((k, v) for k, v in (overrides or {}).items() if k in PLAN_FIELDS))
        key = (id(settings), known)
        try:
            held, plan = _EFFECTIVE[key]
        except KeyError:
            held = None
        except TypeError:  # an override that is not hashable (a list): not remembered
            return dataclasses.replace(cls.default(settings), **dict(known))
        if held is not settings:
            plan = dataclasses.replace(cls.default(settings), **dict(known))
            if len(_EFFECTIVE) >= _EFFECTIVE_MAX:
                _EFFECTIVE.clear()
            _EFFECTIVE[key] = (settings, plan)  # the settings held: their id is not reused meanwhile
        return plan

    def allows(self, stage: str, model_id: str) -> bool:
        """Whether jobs may run model `model_id` in `stage`."""
        allowed = {m.strip() for m in self.allowed_models.split(",") if m.strip()}
        return not allowed or model_id in allowed or f"{stage}:{model_id}" in allowed

    def violations(
        self, prompt: str, priority: str, params: dict[str, Any], models: Mapping[str, str] | None = None
    ) -> list[Violation]:
        """Every limit of this plan that a job (its params and models, stage -> id, complete) goes beyond."""
        out = [
            Violation(f"model.{stage}", "allowed_models", self.allowed_models, model_id)
            for stage, model_id in (models or {}).items()
            if not self.allows(stage, model_id)
        ]
        if len(prompt) > self.max_prompt_chars:
            out.append(Violation("prompt", "max_prompt_chars", self.max_prompt_chars, len(prompt)))
        if PRIORITY_RANK.get(priority, 1) > PRIORITY_RANK[self.max_priority]:
            out.append(Violation("priority", "max_priority", self.max_priority, priority))
        for param, limit in (
            ("width", "max_width"),
            ("height", "max_height"),
            ("num_frames", "max_frames"),
            ("steps", "max_steps"),
        ):
            value = params.get(param)
            if value is not None and value > getattr(self, limit):
                out.append(Violation(f"params.{param}", limit, getattr(self, limit), value))
        return out


PLAN_FIELDS = {f.name: f.type for f in dataclasses.fields(Plan)}
# Limits whose default is a setting of its own name (they predate plans), not `plan_<name>`.
_OWN_SETTING = ("retention_s", "media_url_ttl_s")


def _setting(name: str) -> str:
    return name if name in _OWN_SETTING else f"plan_{name}"


def bounds(name: str) -> tuple[int, int | None]:
    """(least, most) a plan may set `name` to: the bounds of its default's setting (None: no top)."""
    low, high = 0, None
    for rule in Settings.model_fields[_setting(name)].metadata:  # pydantic's Ge / Le markers
        if getattr(rule, "ge", None) is not None:
            low = max(low, int(rule.ge))
        if getattr(rule, "le", None) is not None:
            high = int(rule.le)
    return low, high


def for_tenant(session: Session, settings: Settings, tenant_id: uuid.UUID) -> Plan:
    """The tenant's effective plan (the default one for an unknown tenant)."""
    return Plan.effective(settings, session.scalar(select(Tenant.plan).where(Tenant.id == tenant_id)))


def retention_overrides(session: Session) -> dict[uuid.UUID, int]:
    """Tenant id -> retention_s for the tenants whose plan sets its own (few: most follow the default)."""
    rows = session.execute(select(Tenant.id, Tenant.plan))
    return {tid: int(plan["retention_s"]) for tid, plan in rows if plan and "retention_s" in plan}


def check_overrides(values: dict[str, Any]) -> dict[str, Any]:
    """Validate plan overrides (from the CLI); raises ValueError naming the bad one."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in PLAN_FIELDS:
            raise ValueError(f"unknown plan limit {name!r}; known: {', '.join(PLAN_FIELDS)}")
        if name == "max_priority":
            if value not in PRIORITY_RANK:
                raise ValueError(f"max_priority must be one of: {', '.join(PRIORITY_RANK)}")
        elif name == "allowed_models":
            if not isinstance(value, str) or any(c.isspace() and c != " " for c in value):
                raise ValueError("allowed_models must be comma-separated ids, e.g. 'echo,video:wan-tiny'")
        elif name == "rate_limit":
            try:
                parse_many(str(value))
            except ValueError:
                raise ValueError(f"rate_limit {value!r} is not like '10/second;300/minute'") from None
        elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer")
        else:
            low, high = bounds(name)
            if value < low or (high is not None and value > high):
                top = f" to {high}" if high is not None else " or more"
                raise ValueError(f"{name} must be {low}{top}")
        out[name] = value
    return out
