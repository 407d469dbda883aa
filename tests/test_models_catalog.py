"""The model catalog (GET /v1/models) and a job's choice of model, with real workers."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from models import presence, swaps
from models.cache import cache_key, spec_version
from models.settings import Settings
from tasks.generators import registry
from tests.support.api import assert_problem, authed_client_class, make_api_key, submit, wait_finished
from tests.support.procs import wait_for
from tests.support.workers import thread_workers

TAGGED = "tests.support.generators:TaggedText"
EXTRA = {"extra_models": f"text:tagged={TAGGED}", "model_heartbeat_s": 0.2}


@pytest.fixture
def catalog_app(make_app) -> Flask:
    """An app whose catalog has the `tagged` text model beside the built-ins."""
    return make_app(**EXTRA)


@pytest.fixture
def api(catalog_app: Flask) -> FlaskClient:
    return catalog_app.test_client()


@pytest.fixture
def workers(settings: Settings) -> Iterator[Any]:
    with thread_workers(settings, **EXTRA) as app:
        yield app


def _models(client: FlaskClient) -> dict[tuple[str, str], dict[str, Any]]:
    resp = client.get("/v1/models")
    assert resp.status_code == 200, resp.get_data(as_text=True)
    body = resp.get_json()
    assert body["object"] == "list"
    return {(m["stage"], m["id"]): m for m in body["data"]}


def test_models_lists_every_configured_model_with_its_params_version_and_queue(api, broker) -> None:
    models = _models(api)
    assert set(models) == {
        ("text", "smollm2"), ("text", "echo"), ("text", "tagged"), ("video", "wan-tiny"), ("video", "echo"),
        ("image", "sana-tiny"), ("image", "echo"),
    }  # fmt: skip
    echo = models[("text", "echo")]
    assert echo["default"] is True and models[("text", "smollm2")]["default"] is False
    assert echo["source"] == "builtin" and models[("text", "tagged")]["source"] == "adapter"
    assert echo["modalities"] == ["text", "video", "image", "storyboard"]
    assert models[("video", "echo")]["modalities"] == ["video", "storyboard"]
    assert models[("image", "echo")]["modalities"] == ["image"]
    assert models[("image", "sana-tiny")]["default"] is False
    queues = {echo["queue"], models[("video", "echo")]["queue"], models[("image", "echo")]["queue"]}
    assert len(queues) == 3 and models[("image", "echo")]["queue"] == "image"
    assert echo["version"] and echo["allowed"] is True
    # The bounds are the request validation's own (app.schemas).
    assert echo["params"]["properties"]["max_new_tokens"]["maximum"] == 512
    width = models[("video", "wan-tiny")]["params"]["properties"]["width"]
    assert width["type"] == "integer" and width["multipleOf"] == 16 and width["maximum"] == 1024
    assert "num_images" in models[("image", "sana-tiny")]["params"]["properties"]


def test_a_local_directory_model_has_a_fingerprint(make_app, tmp_path, broker) -> None:
    folder = tmp_path / "tiny-lm"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    client = make_app(text_model=str(folder)).test_client()
    mine = _models(client)[("text", "tiny-lm")]
    assert mine["source"] == "directory" and mine["default"] is True
    assert mine["version"] not in ("", "-")
    assert _models(client)[("text", "echo")]["default"] is False


def test_warm_turns_true_once_a_worker_has_loaded_the_model(api, workers, broker) -> None:
    loaded_before = any(spec == TAGGED for _, spec, _ in registry.loaded())
    assert _models(api)[("text", "tagged")]["warm"] is loaded_before
    job = submit(api, model="tagged").get_json()
    assert wait_finished(api, job["id"])["status"] == "succeeded"
    warm = wait_for(lambda: _models(api)[("text", "tagged")]["warm"], 30, 0.1, "the tagged model to be warm")
    assert warm is True and _models(api)[("text", "tagged")]["warm_workers"] >= 1


def test_a_job_runs_the_named_model_and_records_what_ran(api, workers, broker) -> None:
    named = wait_finished(api, submit(api, model="tagged").get_json()["id"])
    assert named["status"] == "succeeded" and named["outputs"]["text"].startswith("Tagged: ")
    assert named["models"]["text"] == {"asked": "tagged", "id": "tagged", "version": spec_version(TAGGED)}
    assert spec_version(TAGGED).startswith("adapter-")
    default = wait_finished(api, submit(api).get_json()["id"])
    assert default["outputs"]["text"].startswith("Shot: ")
    assert default["models"]["text"]["asked"] is None and default["models"]["text"]["id"] == "echo"
    assert default["models"]["text"]["version"] not in (None, "-")
    # A video job names a model per stage; a plain id names its video stage's.
    video = submit(api, modality="video", params={"width": 64, "height": 64, "num_frames": 1, "steps": 1},
                   model={"text": "tagged", "video": "echo"}).get_json()  # fmt: skip
    done = wait_finished(api, video["id"])
    assert done["status"] == "succeeded", done
    assert done["outputs"]["text"].startswith("Tagged: ")
    assert {s: m["id"] for s, m in done["models"].items()} == {"text": "tagged", "video": "echo"}
    plain = submit(api, modality="video", model="echo", params={"num_frames": 1, "steps": 1}).get_json()
    assert plain["models"] == {
        "text": {"asked": None, "id": None, "version": None},
        "video": {"asked": "echo", "id": None, "version": None},
    }


def test_an_image_job_names_its_models_and_records_what_ran(api, workers, broker) -> None:
    params = {"width": 64, "height": 64, "steps": 1}
    resp = submit(api, modality="image", params=params, model={"text": "tagged", "image": "echo"})
    assert resp.status_code == 202, resp.get_data(as_text=True)
    job = resp.get_json()
    assert job["models"]["image"] == {"asked": "echo", "id": None, "version": None}
    done = wait_finished(api, job["id"])
    assert done["status"] == "succeeded", done
    assert done["outputs"]["text"].startswith("Tagged: ") and done["outputs"]["images"]
    assert done["models"] == {
        "text": {"asked": "tagged", "id": "tagged", "version": spec_version(TAGGED)},
        "image": {"asked": "echo", "id": "echo", "version": spec_version("echo")},
    }
    # A plain id names the image stage's model (the one that makes the output).
    plain = submit(api, modality="image", model="echo", params=params | {"seed": 3}).get_json()
    assert {s: m["asked"] for s, m in plain["models"].items()} == {"text": None, "image": "echo"}
    assert wait_finished(api, plain["id"])["models"]["image"]["id"] == "echo"


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"model": "nope"}, "model", "unknown text model 'nope'; known: smollm2, echo, tagged"),
        ({"model": {"text": "wan-tiny"}}, "model.text", "unknown text model 'wan-tiny'"),
        ({"model": {"video": "echo"}}, "model.video", "only valid for video or storyboard jobs"),
        ({"modality": "video", "model": {"video": "nope"}}, "model.video", "unknown video model 'nope'"),
        ({"modality": "image", "model": "wan-tiny"}, "model", "unknown image model 'wan-tiny'"),
        (
            {"modality": "image", "model": {"video": "echo"}},
            "model.video",
            "only valid for video or storyboard jobs",
        ),
        ({"model": {"audio": "x"}}, "model", "must be a model id, or an object of stage: model id"),
        ({"model": 5}, "model", "must be a model id"),
        ({"model": ""}, "model", "must be a model id"),
    ],
)
def test_an_unknown_model_is_a_422_naming_the_field(api, broker, body, field, message) -> None:
    problem = assert_problem(submit(api, **body), 422)
    [error] = problem["errors"]
    assert error["field"] == field and error["message"].startswith(message), error


def test_a_plan_restricts_the_models_its_jobs_may_run(catalog_app, sessions, broker) -> None:
    key = make_api_key(sessions, "echo-only", allowed_models="echo")
    client = authed_client_class(key)(catalog_app, catalog_app.response_class, True)
    models = _models(client)
    assert models[("text", "echo")]["allowed"] and not models[("text", "tagged")]["allowed"]
    problem = assert_problem(submit(client, model="tagged"), 403)
    assert problem["errors"][0]["field"] == "model.text" and problem["limits"] == {"allowed_models": "echo"}
    assert submit(client, model="echo").status_code == 202
    # One stage's model: a default the plan leaves out is refused too.
    video_only = make_api_key(sessions, "video-echo", allowed_models="video:echo,text:tagged")
    client = authed_client_class(video_only)(catalog_app, catalog_app.response_class, True)
    assert assert_problem(submit(client), 403)["errors"][0]["field"] == "model.text"
    assert submit(client, model="tagged").status_code == 202
    assert submit(client, modality="video", model={"text": "tagged"}).status_code == 202


def test_the_cache_key_includes_the_models(settings: Settings) -> None:
    s = settings.model_copy(update=EXTRA)
    params = {"seed": 1, "max_new_tokens": 64, "temperature": 0.0}
    default = cache_key(s, "text", "a fox", params)
    assert cache_key(s, "text", "a fox", params, {"text": None}) == default
    assert cache_key(s, "text", "a fox", params, {"text": "echo"}) == default  # the default, by its id
    assert cache_key(s, "text", "a fox", params, {"text": "tagged"}) != default
    video = cache_key(s, "video", "a fox", params, {"text": None, "video": None})
    assert cache_key(s, "video", "a fox", params, {"text": "tagged", "video": None}) != video
    image = cache_key(s, "image", "a fox", params)
    assert cache_key(s, "image", "a fox", params, {"text": None, "image": "echo"}) == image
    assert cache_key(s, "image", "a fox", params, {"text": None, "image": "sana-tiny"}) != image


def test_identical_jobs_share_a_result_only_with_the_same_model(api, workers, broker) -> None:
    params = {"seed": 11}
    first = wait_finished(api, submit(api, model="tagged", params=params).get_json()["id"])
    again = submit(api, model="tagged", params=params).get_json()
    assert again["cached"] is True and again["source_job_id"] == first["id"]
    assert again["models"] == first["models"]
    other = submit(api, model="echo", params=params).get_json()
    assert other["cached"] is False
    assert wait_finished(api, other["id"])["outputs"]["text"].startswith("Shot: ")


def test_a_degraded_retry_records_the_model_asked_and_the_one_that_ran(make_app, settings, broker) -> None:
    small = {"extra_models": "video:small=tests.support.generators:SizeLimitedVideo"}
    api = make_app(**small).test_client()
    with thread_workers(settings, degraded_video_model="echo", **small):
        params = {"width": 128, "height": 96, "num_frames": 1, "steps": 4, "allow_degraded": True}
        job = submit(api, modality="video", model="small", params=params).get_json()
        done = wait_finished(api, job["id"])
    assert done["status"] == "succeeded", done
    assert done["degraded"]["from"]["model"] == "small" and done["degraded"]["to"]["model"] == "echo"
    assert done["models"]["video"]["asked"] == "small" and done["models"]["video"]["id"] == "echo"


def test_an_image_jobs_named_model_runs_and_a_degraded_retry_records_the_fallback(
    make_app, settings, broker
) -> None:
    small = {"extra_models": "image:small=tests.support.generators:SizeLimitedImage"}
    api = make_app(**small).test_client()
    with thread_workers(settings, degraded_image_model="echo", **small):
        params = {"width": 128, "height": 128, "steps": 4, "allow_degraded": True}
        job = submit(api, modality="image", model="small", params=params).get_json()
        done = wait_finished(api, job["id"])
    assert done["status"] == "succeeded", done
    # The named model ran (and ran out of memory: only SizeLimitedImage does), then the fallback.
    assert done["degraded"]["from"]["model"] == "small" and done["degraded"]["to"]["model"] == "echo"
    assert done["models"]["image"]["asked"] == "small" and done["models"]["image"]["id"] == "echo"


def test_the_registry_keeps_a_bounded_number_of_models_per_stage_least_recently_used_out() -> None:
    for name in ("lru-a", "lru-b", "lru-c"):  # names no other test loads
        registry.register("text", name, "tasks.generators.echo:EchoTextGenerator")

    def text_models() -> set[str]:
        return {spec for kind, spec, _ in registry.loaded() if kind == "text" and spec.startswith("lru-")}

    first = registry.get_generator("text", "lru-a", keep=1)
    assert registry.get_generator("text", "lru-a", keep=1) is first
    b = registry.get_generator("text", "lru-b", keep=1)
    assert text_models() == {"lru-b"}  # lru-a was unloaded (and every other text model with it)
    again = registry.get_generator("text", "lru-a", keep=2)  # loaded anew, beside lru-b
    assert again is not first and text_models() == {"lru-a", "lru-b"}
    assert registry.get_generator("text", "lru-b", keep=2) is b  # a hit: now the most recently used
    registry.get_generator("text", "lru-c", keep=2)  # a third: the least recently used goes
    assert text_models() == {"lru-b", "lru-c"}


SWAPPED = "tests.support.generators:SwappedText"


def test_a_hot_swap_during_a_stream_of_jobs_switches_versions_once(make_app, settings, broker) -> None:
    extra = {"extra_models": f"text:swappy={TAGGED}", "model_heartbeat_s": 0.2}
    api = make_app(**extra).test_client()
    conn = presence.client(settings.ratelimit_storage_uri)
    old, new = spec_version(TAGGED), spec_version(SWAPPED)
    assert old != new
    with thread_workers(settings, **extra):
        ids = [submit(api, model="swappy", prompt=f"stream {i}").get_json()["id"] for i in range(10)]
        wait_finished(api, ids[0])  # the old weights are loaded and serving
        swaps.swap(conn, "text", "swappy", SWAPPED)  # jobs are still queued and running meanwhile
        ids += [submit(api, model="swappy", prompt=f"stream {i}").get_json()["id"] for i in range(10, 20)]

        def runs_new() -> bool:
            job = wait_finished(api, submit(api, model="swappy", prompt="after the swap").get_json()["id"])
            ids.append(job["id"])
            return job["models"]["text"]["version"] == new

        wait_for(runs_new, 30, 0.1, "a job on the swapped weights")
        done = [wait_finished(api, job_id) for job_id in ids]
    assert all(job["status"] == "succeeded" for job in done)
    for job in done:  # one version per job, and the text of that version's weights
        ran = job["models"]["text"]
        assert ran["id"] == "swappy" and ran["version"] in (old, new)
        assert job["outputs"]["text"].startswith("Tagged: " if ran["version"] == old else "Swapped: ")
    versions = [
        j["models"]["text"]["version"] for j in sorted(done, key=lambda j: j["timings"]["started_at"])
    ]
    changes = sum(1 for a, b in pairwise(versions) if a != b)
    assert versions[0] == old and versions[-1] == new and changes == 1, versions
    # The web follows too: the catalog shows the new version (and new jobs are keyed by it).
    wait_for(lambda: _models(api)[("text", "swappy")]["version"] == new, 10, 0.1, "the new version listed")
    assert swaps.unswap(conn, "text", "swappy")


def test_the_models_cli_swaps_lists_and_unswaps(redis_url, broker, monkeypatch) -> None:
    from click.testing import CliRunner

    from app.cli import main

    monkeypatch.setenv("GENQUEUE_RATELIMIT_URL", redis_url)
    monkeypatch.setenv("GENQUEUE_EXTRA_MODELS", f"text:tagged={TAGGED}")
    runner = CliRunner()
    swapped = runner.invoke(main, ["models", "swap", "text", "tagged", SWAPPED])
    assert swapped.exit_code == 0 and spec_version(SWAPPED) in swapped.output, swapped.output
    listed = runner.invoke(main, ["models", "list"]).output
    assert f'"id": "tagged", "spec": "{SWAPPED}"' in listed
    assert runner.invoke(main, ["models", "swap", "text", "nope", SWAPPED]).exit_code == 2  # no such model
    unswapped = runner.invoke(main, ["models", "unswap", "text", "tagged"])
    assert "back to its configured weights" in unswapped.output
    assert f'"spec": "{TAGGED}"' in runner.invoke(main, ["models", "list"]).output
