"""One definition of a transient outage: what the workers retry, the API answers with 503."""

from __future__ import annotations

import kombu.exceptions
import pytest
import redis.exceptions
import sqlalchemy.exc

from tasks import failures
from tasks.contract.transient import TRANSIENT_ERRORS, is_transient


def _instance(cls: type[BaseException]) -> BaseException:
    if issubclass(cls, sqlalchemy.exc.DBAPIError):
        return cls("SELECT 1", {}, Exception("server closed the connection"))
    return cls("down")


def _invalidated() -> BaseException:
    return sqlalchemy.exc.DBAPIError("SELECT 1", {}, Exception("gone"), connection_invalidated=True)


CASES = [*(_instance(cls) for cls in TRANSIENT_ERRORS), _invalidated()]


def test_the_definition_covers_what_both_sides_met_in_outages() -> None:
    for cls in (
        sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, sqlalchemy.exc.TimeoutError,
        kombu.exceptions.OperationalError, redis.exceptions.ConnectionError, ConnectionError, TimeoutError,
    ):  # fmt: skip
        assert is_transient(_instance(cls)), cls
    assert not is_transient(sqlalchemy.exc.IntegrityError("INSERT", {}, Exception("duplicate")))
    assert not is_transient(ValueError("a bug"))


@pytest.mark.parametrize("exc", CASES, ids=lambda e: type(e).__name__)
def test_workers_retry_it_and_the_api_answers_503(app, exc: BaseException) -> None:
    assert failures.is_transient(exc)  # the workers' retry policy asks the same question

    def boom() -> None:
        raise exc

    app.add_url_rule("/test/boom", "boom", boom)
    resp = app.test_client().get("/test/boom")
    assert resp.status_code == 503, resp.get_data(as_text=True)
    assert resp.mimetype == "application/problem+json"
    assert resp.headers["Retry-After"]
    assert "server closed" not in resp.get_data(as_text=True)  # internals stay out of the body


def _batch_error(cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except Exception as exc:  # as kombu's Redis batch flush does
            raise kombu.exceptions.BatchPublishError("Redis publish batch failed") from exc
    except kombu.exceptions.BatchPublishError as wrapped:
        return wrapped


def test_a_batch_publish_broken_by_an_outage_is_one_and_by_a_bug_is_not(app) -> None:
    assert is_transient(_batch_error(redis.exceptions.ConnectionError("Connection reset by peer")))
    assert not is_transient(_batch_error(ValueError("a bug")))
    assert not is_transient(kombu.exceptions.BatchPublishError("no cause"))

    def boom() -> None:
        raise _batch_error(redis.exceptions.ConnectionError("Connection reset by peer"))

    app.add_url_rule("/test/batch-boom", "batch_boom", boom)
    assert app.test_client().get("/test/batch-boom").status_code == 503
