"""`genqueue flower`: which authentication Flower runs with, decided from Settings before it starts.

Flower 2.2 serves its UI (with worker shutdown and pool grow/shrink controls) to anyone when no
authentication is configured, and answers its HTTP API 401 unless FLOWER_UNAUTHENTICATED_API is
set. With basic auth configured, UI and API both take the same credentials (the API needs no
FLOWER_UNAUTHENTICATED_API then). So: basic auth from GENQUEUE_FLOWER_BASIC_AUTH, or an open
UI and API on a loopback address when GENQUEUE_FLOWER_UNAUTHENTICATED says so, or no Flower.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from models.settings import Settings

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
DEFAULT_ADDRESS = "127.0.0.1"
# Set by this decision only: inherited values would bypass it.
DECIDED = ("FLOWER_BASIC_AUTH", "FLOWER_UNAUTHENTICATED_API")


class FlowerAuthError(ValueError):
    """Flower's authentication settings are missing, contradictory or malformed."""


def _credentials(value: str) -> list[str]:
    entries = [e.strip() for e in value.split(",")]
    for n, entry in enumerate(entries, 1):
        user, sep, password = entry.partition(":")
        if not (user and sep and password):
            # Name the position, never the value: it is a secret.
            raise FlowerAuthError(
                f"GENQUEUE_FLOWER_BASIC_AUTH entry {n} is not user:password "
                "(entries are separated by commas, so a password cannot contain one)"
            )
    return entries


def _address(environ: Mapping[str, str], args: Sequence[str]) -> str:
    for i, arg in enumerate(args):
        if arg.startswith("--address="):
            return arg.split("=", 1)[1]
        if arg == "--address" and i + 1 < len(args):
            return args[i + 1]
    return environ.get("FLOWER_ADDRESS") or DEFAULT_ADDRESS


def flower_environment(
    settings: Settings, environ: Mapping[str, str], args: Sequence[str] = ()
) -> dict[str, str]:
    """The environment to run Flower with (`environ` plus the decision); raises FlowerAuthError.

    Credentials travel in the environment, never in argv, where the process list shows them.
    """
    if any(a.startswith(("--basic-auth", "--basic_auth")) for a in args):
        raise FlowerAuthError(
            "pass Flower's credentials as GENQUEUE_FLOWER_BASIC_AUTH, not --basic-auth: "
            "the process list shows command lines"
        )
    env = {k: v for k, v in environ.items() if k not in DECIDED}
    env.setdefault("FLOWER_ADDRESS", DEFAULT_ADDRESS)
    basic = settings.flower_basic_auth.get_secret_value() if settings.flower_basic_auth else ""
    if basic and settings.flower_unauthenticated:
        raise FlowerAuthError(
            "GENQUEUE_FLOWER_BASIC_AUTH and GENQUEUE_FLOWER_UNAUTHENTICATED=true are both set; set one"
        )
    if basic:
        env["FLOWER_BASIC_AUTH"] = ",".join(_credentials(basic))
        return env
    if settings.flower_unauthenticated:
        address = _address(env, args)
        if address not in LOOPBACK:
            raise FlowerAuthError(
                f"GENQUEUE_FLOWER_UNAUTHENTICATED=true serves Flower only on a loopback address, "
                f"not {address!r}; set GENQUEUE_FLOWER_BASIC_AUTH to serve it on the network"
            )
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
        return env
    if env.get("FLOWER_AUTH"):  # Flower's own OAuth (FLOWER_AUTH + FLOWER_OAUTH2_*), configured directly
        return env
    raise FlowerAuthError(
        "Flower has no authentication configured and would serve its controls to anyone: set "
        "GENQUEUE_FLOWER_BASIC_AUTH=user:password (or, on a development machine only, "
        "GENQUEUE_FLOWER_UNAUTHENTICATED=true)"
    )
