"""API keys and tenants: create, find, list, revoke; plans stored per tenant. Keys are kept hashed.

A key is `gq_<prefix>_<secret>`: the 8-character prefix is stored in clear to find the row
and to name the key in listings and logs; the whole key is stored only as its SHA-256.
The secret carries 256 random bits, so a fast hash is enough (no password stretching):
nobody can guess a preimage, and checking a key costs one indexed lookup per request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from models.base import utcnow
from models.plans import PLAN_FIELDS, check_overrides
from models.tenant import DEFAULT_TENANT_ID, DEFAULT_TENANT_NAME, ApiKey, Tenant

KEY_SCHEME = "gq_"
PREFIX_LEN = 8
_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
KEY_PATTERN = re.compile(rf"^{KEY_SCHEME}([a-z0-9]{{{PREFIX_LEN}}})_[A-Za-z0-9_-]{{43}}$")
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _new_key() -> tuple[str, str]:
    prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(PREFIX_LEN))
    return f"{KEY_SCHEME}{prefix}_{secrets.token_urlsafe(32)}", prefix


def ensure_default_tenant(session: Session) -> Tenant:
    tenant = session.get(Tenant, DEFAULT_TENANT_ID)
    if tenant is None:
        tenant = Tenant(id=DEFAULT_TENANT_ID, name=DEFAULT_TENANT_NAME, plan={})
        session.add(tenant)
        session.flush()
    return tenant


def get_tenant(session: Session, name: str) -> Tenant | None:
    return session.scalar(select(Tenant).where(Tenant.name == name))


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    if name == DEFAULT_TENANT_NAME:
        return ensure_default_tenant(session)
    if not TENANT_NAME.match(name):
        raise ValueError("a tenant name is 1-64 letters, digits, '.', '_' or '-', starting alphanumeric")
    tenant = get_tenant(session, name)
    if tenant is None:
        tenant = Tenant(name=name, plan={})
        session.add(tenant)
        session.flush()
    return tenant


def create_key(session: Session, tenant_name: str, label: str | None = None) -> tuple[ApiKey, str]:
    """A new key for the tenant (created if new). The clear key is returned here and never again."""
    tenant = get_or_create_tenant(session, tenant_name)
    while True:
        key, prefix = _new_key()
        if session.scalar(select(ApiKey.id).where(ApiKey.prefix == prefix)) is None:
            break
    row = ApiKey(tenant_id=tenant.id, prefix=prefix, key_hash=hash_key(key), label=label)
    session.add(row)
    session.flush()
    return row, key


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: the tenant and the key it presented (by prefix only)."""

    tenant_id: uuid.UUID
    tenant_name: str
    key_prefix: str
    plan_overrides: dict[str, Any]


def authenticate(session: Session, key: str) -> Principal | None:
    """The principal of a valid, unrevoked key; None for anything else."""
    match = KEY_PATTERN.match(key)
    if match is None:
        return None
    row = session.execute(
        select(ApiKey, Tenant)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.prefix == match.group(1), ApiKey.revoked_at.is_(None))
    ).first()
    if row is None or not hmac.compare_digest(row.ApiKey.key_hash, hash_key(key)):
        return None
    return Principal(row.Tenant.id, row.Tenant.name, row.ApiKey.prefix, dict(row.Tenant.plan or {}))


def revoke_key(session: Session, prefix: str) -> bool:
    """Revoke by prefix (a whole key is accepted too); False when no active key has it."""
    match = KEY_PATTERN.match(prefix)
    prefix = match.group(1) if match else prefix.removeprefix(KEY_SCHEME)
    row = session.scalar(select(ApiKey).where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None)))
    if row is None:
        return False
    row.revoked_at = utcnow()
    return True


@dataclass(frozen=True)
class KeyInfo:
    prefix: str
    tenant: str
    label: str | None
    created_at: datetime
    revoked_at: datetime | None


def list_keys(session: Session, tenant_name: str | None = None) -> list[KeyInfo]:
    stmt = select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id)
    if tenant_name is not None:
        stmt = stmt.where(Tenant.name == tenant_name)
    rows = session.execute(stmt.order_by(Tenant.name, ApiKey.created_at))
    return [KeyInfo(k.prefix, name, k.label, k.created_at, k.revoked_at) for k, name in rows]


def set_plan(
    session: Session,
    tenant_name: str,
    changes: dict[str, Any],
    unset: tuple[str, ...] = (),
    reset: bool = False,
) -> Tenant:
    """Merge plan overrides into the tenant's; `unset` names go back to the default, `reset` all."""
    tenant = get_or_create_tenant(session, tenant_name)
    plan = {} if reset else dict(tenant.plan or {})
    plan.update(check_overrides(changes))
    for name in unset:
        if name not in PLAN_FIELDS:
            raise ValueError(f"unknown plan limit {name!r}")
        plan.pop(name, None)
    tenant.plan = plan  # a new dict: JSON columns do not track in-place changes
    return tenant
