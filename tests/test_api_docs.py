"""The API reference at /docs: Swagger UI from the wheel's own files, its examples, and a real browser."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from app import api_docs, openapi_examples

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def test_assets_come_from_the_wheel_with_long_cache_headers(client) -> None:
    for name, mimetype in (
        ("swagger-ui.css", "text/css"),
        ("swagger-ui-bundle.js", "text/javascript"),
        ("genqueue-docs.js", "text/javascript"),
    ):
        resp = client.get(f"/docs/assets/{name}?v={api_docs.ui_version()}")
        assert resp.status_code == 200 and resp.mimetype == mimetype, name
        assert resp.headers["Cache-Control"] == "public, max-age=31536000, immutable"
        assert len(resp.data) > (100 if name.endswith("docs.js") else 100_000)
        again = client.get(f"/docs/assets/{name}", headers={"If-None-Match": resp.headers["ETag"]})
        assert again.status_code == 304
    assert b"SwaggerUIBundle" in client.get("/docs/assets/genqueue-docs.js").data


@pytest.mark.parametrize("name", ["index.html", "..%2Fapp.py", "oauth2-redirect.html", "LICENSE", "x.js"])
def test_only_the_listed_assets_are_served(client, name: str) -> None:
    resp = client.get(f"/docs/assets/{name}")
    assert resp.status_code == 404 and resp.mimetype == "application/problem+json"


def _validator(spec: dict, schema: dict) -> Draft202012Validator:
    # The schemas' $refs (#/components/schemas/...) point into the document: carry its components.
    return Draft202012Validator({"components": spec["components"], **schema})


def test_examples_match_their_schemas(client) -> None:
    spec = client.get("/openapi.json").get_json()
    checked = 0
    for ops in spec["paths"].values():
        for op in ops.values():
            bodies = [op.get("requestBody", {}), *op["responses"].values()]
            for body in bodies:
                for media in body.get("content", {}).values():
                    for example in media.get("examples", {}).values():
                        _validator(spec, media["schema"]).validate(example["value"])
                        checked += 1
    assert checked > 20
    post = spec["paths"]["/v1/jobs"]["post"]
    examples = post["requestBody"]["content"]["application/json"]["examples"]
    assert set(examples) == {"video", "video_model", "image", "text"}
    assert "examples" in post["responses"]["422"]["content"]["application/problem+json"]


def test_example_problems_are_the_apps(client, api_key) -> None:
    """The documented 404 and 422 look like the real ones (type, title, status)."""
    real = client.get("/v1/jobs/0b6f9c2e-5d1a-4c3e-9f7a-2e8d4b1c6a90").get_json()
    doc = openapi_examples.PROBLEMS[404]["value"]
    assert {k: real[k] for k in ("type", "title", "status")} == {
        k: doc[k] for k in ("type", "title", "status")
    }
    real = client.post(
        "/v1/jobs", json={"prompt": "x", "modality": "video", "params": {"width": 100}}
    ).get_json()
    doc = openapi_examples.PROBLEMS[422]["value"]
    assert {k: real[k] for k in ("type", "title", "status")} == {
        k: doc[k] for k in ("type", "title", "status")
    }
    assert real["errors"][0]["field"] == doc["errors"][0]["field"]


# -- a real browser on a real server ------------------------------------------------------------
@pytest.fixture
def served(app) -> Iterator[str]:
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(5)


@pytest.fixture
def browser() -> Iterator[object]:
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (os.access(CHROMIUM, os.X_OK) and shutil.which(CHROMEDRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,2400"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    yield driver
    driver.quit()


@pytest.mark.slow
def test_docs_render_and_authorize_in_a_browser(served, browser, api_key, tmp_path: Path) -> None:
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    spec = httpx.get(f"{served}/openapi.json").json()
    operations = sum(len(ops) for ops in spec["paths"].values())
    browser.get(f"{served}/docs")
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock")) == operations)
    summaries = {
        (e.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
         e.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"))
        for e in browser.find_elements(By.CSS_SELECTOR, ".opblock")
    }  # fmt: skip
    assert ("POST", "/v1/jobs") in summaries and ("GET", "/v1/jobs/{job_id}") in summaries
    browser.save_screenshot(str(tmp_path / "docs.png"))

    # Authorize with a key, then run "List jobs" from the page: the key goes with the request.
    browser.find_element(By.CSS_SELECTOR, "button.authorize").click()
    field = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, ".auth-container input")))
    field.send_keys(api_key)
    browser.find_element(By.CSS_SELECTOR, ".auth-btn-wrapper button.authorize").click()
    browser.find_element(By.CSS_SELECTOR, ".auth-btn-wrapper button.btn-done").click()
    listing = browser.find_element(By.ID, "operations-Jobs-listJobs")
    listing.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    wait.until(lambda d: listing.find_elements(By.CSS_SELECTOR, "button.try-out__btn"))[0].click()
    wait.until(lambda d: listing.find_elements(By.CSS_SELECTOR, "button.execute"))[0].click()
    status = wait.until(
        lambda d: listing.find_elements(By.CSS_SELECTOR, ".live-responses-table tbody .response-col_status")
    )
    wait.until(lambda d: status[0].text.strip())
    browser.save_screenshot(str(tmp_path / "docs-try-it-out.png"))
    assert status[0].text.strip().startswith("200"), status[0].text
    print(f"screenshots in {tmp_path}")


def test_docs_page_runs_no_inline_script(client, settings) -> None:
    csp = client.get("/docs").headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == "'self'" and directives["default-src"] == "'none'"
    assert directives["connect-src"].startswith("'self'")
