"""Fuzzing with schemathesis from /openapi.json: no 5xx, every response as documented.

Stateless: each operation with generated valid and invalid inputs. Stateful: chains that follow
the document's links (submit -> get / cancel / content). Bounded example counts keep it a
regular test; GENQUEUE_FUZZ_EXAMPLES raises them for a longer run.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, MutableMapping
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
import schemathesis
import schemathesis.cli
from click.testing import CliRunner
from hypothesis import HealthCheck, Phase, given, settings
from pydantic import SecretStr
from schemathesis import GenerationMode
from schemathesis.hooks import GLOBAL_HOOK_DISPATCHER
from schemathesis.specs.openapi.checks import positive_data_acceptance
from schemathesis.specs.openapi.schemas import OpenApiSchema
from werkzeug.serving import make_server

from app import create_app, idempotency, jobs, openapi_rules
from models import ssrf

EXAMPLES = int(os.environ.get("GENQUEUE_FUZZ_EXAMPLES", "25"))
HYPOTHESIS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same inputs every run: a failure here is reproducible
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def fuzz_app(settings, sessions, broker):
    # Limits high enough that the fuzzer explores inputs rather than the rate limiter.
    # Signing keys and CORS on: the signed-link route checks forged links, not a switched-off feature.
    overrides = {"plan_rate_limit": "100000/second", "media_url_keys": SecretStr("fuzz-media-key")}
    flask_app = create_app(settings.model_copy(update=overrides | {"cors_origins": ["https://page.example"]}))
    yield flask_app
    flask_app.extensions["genqueue"].engine.dispose()


@pytest.fixture
def api_schema(fuzz_app, api_key) -> OpenApiSchema:
    schema = schemathesis.openapi.from_wsgi("/openapi.json", fuzz_app)

    # Registered as the schema's auth, so schemathesis knows the credentials are real and leaves
    # them out of the cases that test a missing Authorization header (those must get a 401).
    @schema.auth()
    class BearerKey:
        def get(self, case, ctx) -> str:
            return api_key

        def set(self, case, data: str, ctx) -> None:
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}

    return schema


# Operations with inputs get invalid ones too; the rest have nothing to get wrong.
WITH_INPUTS = [
    ("POST", "/v1/jobs"), ("POST", "/v1/jobs/batch"),
    ("GET", "/v1/jobs"), ("GET", "/v1/jobs/{job_id}"), ("DELETE", "/v1/jobs/{job_id}"),
    ("POST", "/v1/jobs/{job_id}/cancel"), ("GET", "/v1/jobs/{job_id}/content"),
    ("GET", "/v1/jobs/{job_id}/events"),
    ("GET", "/v1/jobs/{job_id}/webhook-deliveries"),
    ("POST", "/v1/webhook-deliveries/{delivery_id}/redeliver"),
    ("POST", "/v1/webhooks"), ("DELETE", "/v1/webhooks/{endpoint_id}"), ("GET", "/v1/usage"),
    ("GET", "/v1/media/{job_id}/{variant}"),
    ("GET", "/docs/assets/{name}"),
]  # fmt: skip
WITHOUT_INPUTS = [
    ("GET", "/v1/health"), ("GET", "/v1/ready"), ("GET", "/docs"), ("GET", "/metrics"), ("GET", "/v1/models"),
    ("GET", "/v1/webhooks"), ("GET", "/v1/webhooks/secret"), ("POST", "/v1/webhooks/secret/rotate"),
]  # fmt: skip
# Every check but "schema-valid input is accepted": a valid-looking input may still be refused
# for reasons a schema cannot state (a control character in metadata, a forged cursor, the
# tenant's plan or quota), always with a documented 4xx.
EXCLUDED = [positive_data_acceptance]


def test_every_operation_is_fuzzed(api_schema) -> None:
    documented = {(op.ok().method.upper(), op.ok().path) for op in api_schema.get_all_operations()}
    # /openapi.json itself is the loaded document; schemathesis leaves it out.
    assert documented == set(WITH_INPUTS + WITHOUT_INPUTS)


@pytest.mark.parametrize(
    ("method", "path", "mode"),
    [(m, p, GenerationMode.POSITIVE) for m, p in WITH_INPUTS + WITHOUT_INPUTS]
    + [(m, p, GenerationMode.NEGATIVE) for m, p in WITH_INPUTS],
)
def test_stateless(api_schema, method: str, path: str, mode: GenerationMode) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @HYPOTHESIS
    def run(case) -> None:
        case.call_and_validate(excluded_checks=EXCLUDED)

    run()


def test_stateful(api_schema) -> None:
    # The job workflow (submit -> get / cancel / content) is what the links describe.
    base = api_schema.include(path_regex=r"^/v1/jobs").as_state_machine()

    seen: Counter[tuple[str, int]] = Counter()

    class Workflow(base):  # type: ignore[misc, valid-type]
        def after_call(self, response, case):
            seen[(case.operation.label, response.status_code)] += 1

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, excluded_checks=EXCLUDED, transport_kwargs=kwargs or None)

    Workflow.run(
        settings=settings(
            max_examples=max(5, EXAMPLES // 2),
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )
    # The links were followed: a job submitted in a scenario was then read through its id (a 304,
    # for a generated If-None-Match such as `*`, is answered only for a job found, like a 200).
    read = seen[("GET /v1/jobs/{job_id}", 200)] + seen[("GET /v1/jobs/{job_id}", 304)]
    assert seen[("POST /v1/jobs", 202)] and read, seen


# --- the schemathesis CLI, `--checks all`, every phase, over HTTP --------------------------------
#
# What the document cannot state is supplied here, never by relaxing a check:
# - a webhook URL's host must resolve to public addresses: a schema-valid URL gets HOOK_DOMAIN as
#   its host, which the test's resolver maps to a public-looking address (the production SSRF
#   check is unchanged and still judges that address; nothing is sent, no worker runs);
# - a cursor is valid only if the server made it: a schema-valid cursor is swapped for a real one;
# - integer params are written without a fraction (strict models), which JSON Schema cannot say:
#   a schema-valid 256.0 is sent as 256;
# - an Idempotency-Key reused with another body is a 422 (the IETF draft's answer): a schema-valid
#   key is tied to the body, so a repeat is a real replay and never a misuse;
# - a usage window's `from` must come before `to`, at most 366 days apart (and with `to` alone,
#   30 days before it must exist): schema-valid bounds become such a window, derived from them.

HOOK_DOMAIN = "hooks.test"  # .test is reserved (RFC 6761): it never resolves for real
PUBLIC_LOOKING = "93.184.215.14"  # global unicast (IANA); never connected to here
CLI_EXAMPLES = int(os.environ.get("GENQUEUE_FUZZ_CLI_EXAMPLES", "20"))
# Deterministic by default (a failure reproduces); GENQUEUE_FUZZ_SEED=N draws other inputs.
CLI_SEED = os.environ.get("GENQUEUE_FUZZ_SEED")
DETERMINISTIC = ["--generation-deterministic"]


def _hook_host(host: object) -> bool:
    return isinstance(host, str) and (host == HOOK_DOMAIN or host.endswith("." + HOOK_DOMAIN))


@pytest.fixture
def test_hosts(monkeypatch) -> Callable[[str], None]:
    """test_hosts(address): names under HOOK_DOMAIN resolve to `address`; every other lookup is
    the real one. The SSRF check itself is untouched: it still judges the address it is given."""
    real = socket.getaddrinfo

    def resolve_to(address: str) -> None:
        def getaddrinfo(host, port, *args, **kwargs):
            if _hook_host(host):
                return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port or 0))]
            return real(host, port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    return resolve_to


@pytest.fixture
def public_test_hosts(test_hosts) -> None:
    test_hosts(PUBLIC_LOOKING)


def test_webhook_registration_succeeds_for_a_public_test_host(client, public_test_hosts, api_schema) -> None:
    endpoint = {"url": f"https://a.{HOOK_DOMAIN}:8443/hook?x=1", "events": ["job.failed"]}
    resp = client.post("/v1/webhooks", json=endpoint)
    assert resp.status_code == 201, resp.get_json()
    api_schema["/v1/webhooks"]["POST"].validate_response(resp)  # 201 is documented: its body conforms
    webhook = {"url": f"http://{HOOK_DOMAIN}/"}
    job = client.post("/v1/jobs", json={"prompt": "p", "modality": "text", "webhook": webhook})
    assert job.status_code == 202, job.get_json()


@pytest.mark.parametrize("address", [None, "127.0.0.1", "10.0.0.7", "169.254.169.254"])
def test_the_test_host_is_still_judged_by_the_ssrf_check(client, test_hosts, address) -> None:
    # Without the resolver the name does not resolve; with it, a non-public address is refused.
    if address is not None:
        test_hosts(address)
    resp = client.post("/v1/webhooks", json={"url": f"https://a.{HOOK_DOMAIN}/hook"})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["field"] == "url", resp.get_json()
    assert ("does not resolve" if address is None else address) in resp.get_json()["errors"][0]["message"]


def _public_host(url: str) -> str:
    """`url` with its host replaced by HOOK_DOMAIN (scheme, port, path and the rest kept)."""
    host = re.match(openapi_rules.URL_SCHEME + openapi_rules.URL_HOST, url)
    assert host is not None
    scheme = re.match(openapi_rules.URL_SCHEME, url)
    assert scheme is not None
    return (url[: scheme.end()] + HOOK_DOMAIN + url[host.end() :])[: ssrf.MAX_URL_CHARS]


def _with_public_host(holder: object) -> None:
    if isinstance(holder, dict):
        url = holder.get("url")
        valid = isinstance(url, str) and len(url) <= ssrf.MAX_URL_CHARS
        if valid and re.fullmatch(openapi_rules.URL_PATTERN, url):
            holder["url"] = _public_host(url)


def _whole(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 2**63 else value


def _real_cursor(value: str) -> str:
    digest = hashlib.sha256(value.encode()).digest()
    job = SimpleNamespace(
        created_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=int.from_bytes(digest[:3])),
        id=uuid.UUID(bytes=digest[:16]),
    )
    return jobs._encode_cursor(job)  # type: ignore[arg-type]


def _real_window(query: MutableMapping) -> None:
    """Schema-valid `from`/`to` made into a window the API accepts (one day from a time in 2026)."""
    given = [query.get(k) for k in ("from", "to") if k in query]
    if not given or not all(isinstance(v, str) and DATE_TIME.fullmatch(v) for v in given):
        return
    digest = hashlib.sha256(repr(given).encode()).digest()
    start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=int.from_bytes(digest[:3]))
    if "from" in query:
        query["from"] = start.isoformat()
    if "to" in query:
        query["to"] = (start + timedelta(days=1)).isoformat()


# RFC 3339 date-time, as `format: date-time` generates it.
DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})", re.ASCII)


def _valid_job(body: object) -> None:
    """A job body's webhook host made public, its integer params written without a fraction."""
    if not isinstance(body, dict):
        return
    _with_public_host(body.get("webhook"))
    params = body.get("params")
    if isinstance(params, dict):
        body["params"] = {k: _whole(v) for k, v in params.items()}


def before_call(context, case, kwargs) -> None:
    """A schemathesis hook: keep schema-valid values valid where the document cannot say how.
    Each rewrite leaves an invalid value alone, so negative cases stay negative."""
    if case.method.upper() == "POST" and case.path == "/v1/webhooks":
        _with_public_host(case.body)
    if case.method.upper() == "POST" and case.path == "/v1/jobs":
        _valid_job(case.body)
    if case.method.upper() == "POST" and case.path == "/v1/jobs/batch" and isinstance(case.body, dict):
        for job in case.body.get("jobs") if isinstance(case.body.get("jobs"), list) else []:
            _valid_job(job)  # each job as POST /v1/jobs takes it
    if case.method.upper() == "GET" and case.path == "/v1/jobs" and isinstance(case.query, MutableMapping):
        cursor = case.query.get("cursor")
        if isinstance(cursor, str) and re.fullmatch(openapi_rules.CURSOR["pattern"], cursor):
            case.query["cursor"] = _real_cursor(cursor)
    if case.method.upper() == "GET" and case.path == "/v1/usage" and isinstance(case.query, MutableMapping):
        _real_window(case.query)
    submits = ("/v1/jobs", "/v1/jobs/batch")
    if case.method.upper() == "POST" and case.path in submits and isinstance(case.headers, MutableMapping):
        key = case.headers.get(idempotency.HEADER)
        if isinstance(key, str) and 1 <= len(key) <= 255 and re.fullmatch(r"[ -~]+", key):
            body = hashlib.sha256(repr(case.body).encode()).hexdigest()[:40]
            case.headers[idempotency.HEADER] = f"{key[:190]}.{body}"


@pytest.fixture
def answers() -> Iterator[Counter[tuple[str, int]]]:
    """The hooks, registered while the test runs; yields the count of (operation, status) seen."""
    seen: Counter[tuple[str, int]] = Counter()

    def after_call(context, case, response) -> None:
        seen[(f"{case.method.upper()} {case.path}", response.status_code)] += 1

    schemathesis.hook(before_call)
    schemathesis.hook(after_call)
    yield seen
    GLOBAL_HOOK_DISPATCHER.unregister(before_call)
    GLOBAL_HOOK_DISPATCHER.unregister(after_call)


@pytest.fixture
def live_api(settings, sessions, broker):
    """The app over real HTTP (werkzeug, threaded), as the CLI talks to a deployment."""
    flask_app = create_app(
        # The fuzzer explores inputs, not the rate limiter; `Prefer: wait` would hold a request
        # (no worker runs) for up to max_wait_s.
        settings.model_copy(
            update={
                "plan_rate_limit": "100000/second",
                "max_wait_s": 1,
                "media_url_keys": SecretStr("fuzz-media-key"),
                "cors_origins": ["https://page.example"],
            }
        )
    )
    server = make_server("127.0.0.1", 0, flask_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="fuzz-api", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=10)
    flask_app.extensions["genqueue"].engine.dispose()


@pytest.mark.slow
def test_cli_checks_all(live_api, api_key, public_test_hosts, answers, tmp_path, monkeypatch) -> None:
    """`st run --checks all` over every operation and phase (examples, coverage, fuzzing,
    stateful) reports no failure: the document matches the API."""
    monkeypatch.chdir(tmp_path)  # the CLI's cache stays out of the tree
    # The key as the document's bearerAuth scheme, so the CLI leaves it out where it tests a
    # missing or wrong Authorization (a plain --header would be sent on those too).
    config = tmp_path / "schemathesis.toml"
    # A schema-valid request may meet a job the stateful phase deleted first (DELETE
    # /v1/jobs/{id}): its content then answers 410 Gone, documented; schemathesis's default
    # accepted statuses for such requests lack 410 (404 and 409 are in).
    accepted = '["2xx", "3xx", "401", "403", "404", "409", "410", "429", "5xx"]'
    config.write_text(
        f'[auth.openapi.bearerAuth]\nbearer = "{api_key}"\n\n'
        f"[checks.positive_data_acceptance]\nexpected-statuses = {accepted}\n"
    )
    args = [
        "--config-file", str(config), "run", f"{live_api}/openapi.json", "--checks", "all",
        # DELETE /v1/jobs/{id} keeps the job visible by design (`data_removed: true`, like an
        # expired job: its row stays for usage), so a later GET of it or its deliveries is a 200,
        # which "use after free" reports. Revisit if DELETE is to hide the job (docs/API.md). Off
        # on the command line: there `--checks all` outranks a config file's `enabled = false`.
        "--exclude-checks", "use_after_free",
        "--max-examples", str(CLI_EXAMPLES), *(["--seed", CLI_SEED] if CLI_SEED else DETERMINISTIC),
        "--workers", "2", "--request-timeout", "10", "--no-color", "--output-sanitize", "false",
    ]  # fmt: skip
    result = CliRunner().invoke(schemathesis.cli.schemathesis, args, catch_exceptions=False)
    summary = result.output[result.output.find("=== SUMMARY") :]
    assert result.exit_code == 0, result.output[-20000:]
    assert "23 selected / 23 total" in result.output and "Tested: 23" in summary, summary
    # The success paths were reached, webhook registration included (through the test resolver).
    reached = [
        ("POST /v1/webhooks", 201), ("DELETE /v1/webhooks/{endpoint_id}", 204), ("POST /v1/jobs", 202),
        ("GET /v1/jobs", 200), ("GET /v1/jobs/{job_id}", 200), ("GET /v1/usage", 200),
        ("POST /v1/jobs/batch", 202),
    ]  # fmt: skip
    assert all(answers[r] for r in reached), answers
