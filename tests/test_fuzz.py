"""Fuzzing with schemathesis from /openapi.json: no 5xx, every response as documented.

Stateless: each operation with generated valid and invalid inputs. Stateful: chains that follow
the document's links (submit -> get / cancel / content). Bounded example counts keep it a
regular test; GENQUEUE_FUZZ_EXAMPLES raises them for a longer run.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance
from schemathesis.specs.openapi.schemas import OpenApiSchema

from app import create_app

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
    flask_app = create_app(settings.model_copy(update={"plan_rate_limit": "100000/second"}))
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
    ("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/{job_id}"),
    ("POST", "/v1/jobs/{job_id}/cancel"), ("GET", "/v1/jobs/{job_id}/content"),
    ("GET", "/v1/jobs/{job_id}/webhook-deliveries"),
    ("POST", "/v1/webhook-deliveries/{delivery_id}/redeliver"),
    ("POST", "/v1/webhooks"), ("DELETE", "/v1/webhooks/{endpoint_id}"),
]  # fmt: skip
WITHOUT_INPUTS = [
    ("GET", "/v1/health"), ("GET", "/v1/ready"), ("GET", "/docs"), ("GET", "/metrics"),
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
    # The links were followed: a job submitted in a scenario was then read through its id.
    assert seen[("POST /v1/jobs", 202)] and seen[("GET /v1/jobs/{job_id}", 200)], seen
