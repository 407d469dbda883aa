"""Flower's authentication decision (app.flower_auth): basic auth, loopback-only open mode, or refusal."""

from __future__ import annotations

from typing import Any

import pytest

from app.flower_auth import FlowerAuthError, flower_environment
from models.settings import Settings


def _settings(**kw: Any) -> Settings:
    return Settings(**kw)


def test_basic_auth_goes_to_flower_through_the_environment_and_wins_over_inherited_values() -> None:
    inherited = {"FLOWER_BASIC_AUTH": "old:x", "FLOWER_UNAUTHENTICATED_API": "true", "PATH": "/bin"}
    env = flower_environment(_settings(flower_basic_auth="ops:s3cret:x, dev:pw"), inherited)
    assert env["FLOWER_BASIC_AUTH"] == "ops:s3cret:x,dev:pw"  # a colon in a password is fine
    assert "FLOWER_UNAUTHENTICATED_API" not in env
    assert env["FLOWER_ADDRESS"] == "127.0.0.1" and env["PATH"] == "/bin"
    assert (
        flower_environment(_settings(flower_basic_auth="a:b"), {"FLOWER_ADDRESS": "0.0.0.0"})[
            "FLOWER_ADDRESS"
        ]
        == "0.0.0.0"
    )


def test_no_authentication_refuses_even_with_flowers_own_unauthenticated_api_switch() -> None:
    with pytest.raises(FlowerAuthError, match="GENQUEUE_FLOWER_BASIC_AUTH"):
        flower_environment(_settings(), {"FLOWER_UNAUTHENTICATED_API": "true"})
    with pytest.raises(FlowerAuthError):
        flower_environment(_settings(), {"FLOWER_BASIC_AUTH": "set:directly"})


@pytest.mark.parametrize("value", ["ops", "ops:", ":pw", "ops:pw,", "a:b,,c:d"])
def test_malformed_credentials_are_refused_without_echoing_them(value: str) -> None:
    with pytest.raises(FlowerAuthError) as err:
        flower_environment(_settings(flower_basic_auth=value), {})
    assert "pw" not in str(err.value) and "ops" not in str(err.value)


def test_unauthenticated_mode_opens_ui_and_api_on_loopback_only() -> None:
    open_ = _settings(flower_unauthenticated=True)
    assert flower_environment(open_, {})["FLOWER_UNAUTHENTICATED_API"] == "true"
    assert flower_environment(open_, {"FLOWER_ADDRESS": "::1"})["FLOWER_ADDRESS"] == "::1"
    with pytest.raises(FlowerAuthError, match="loopback"):
        flower_environment(open_, {"FLOWER_ADDRESS": "0.0.0.0"})
    with pytest.raises(FlowerAuthError, match="loopback"):
        flower_environment(open_, {}, ["--address=10.0.0.5"])
    with pytest.raises(FlowerAuthError, match="loopback"):
        flower_environment(open_, {}, ["--address", "0.0.0.0"])


def test_contradictory_or_argv_credentials_are_refused() -> None:
    with pytest.raises(FlowerAuthError, match="both"):
        flower_environment(_settings(flower_basic_auth="a:b", flower_unauthenticated=True), {})
    with pytest.raises(FlowerAuthError, match="process list"):
        flower_environment(_settings(flower_basic_auth="a:b"), {}, ["--basic-auth=a:b"])


def test_flowers_own_oauth_counts_as_authentication() -> None:
    env = flower_environment(_settings(), {"FLOWER_AUTH": ".*@example\\.com"})
    assert env["FLOWER_AUTH"] == ".*@example\\.com"
