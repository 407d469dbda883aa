"""A real job's MP4 played by headless Chromium from a page on another origin, through its signed link."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import pytest

from tests.support.procs import gunicorn_web, wait_for

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
MEDIA_KEY = "browser-test-media-key"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason="chromium and chromium-driver (bin/services)",
    ),
]

webdriver = pytest.importorskip("selenium.webdriver")

PAGE = """<!doctype html><html><body>
<video id="v" crossorigin="anonymous" muted playsinline preload="auto"></video>
</body></html>"""

# Load, read what the element knows, seek to the middle, play; resolves with what happened.
PLAY = """
const [src, done] = arguments;
const v = document.getElementById('v');
const out = {};
const fail = (what) => done({...out, failed: what, error: v.error && [v.error.code, v.error.message]});
v.addEventListener('error', () => fail('error'));
setTimeout(() => fail('timeout'), 20000);
v.addEventListener('loadedmetadata', () => {
  Object.assign(out, {duration: v.duration, width: v.videoWidth, height: v.videoHeight});
  v.addEventListener('seeked', () => {
    out.seekedTo = v.currentTime;
    v.play().then(() => {
      const check = () => v.currentTime > out.seekedTo + 0.3 ? done({...out, playedTo: v.currentTime})
                                                              : setTimeout(check, 50);
      check();
    }, (e) => fail('play: ' + e));
  }, {once: true});
  v.currentTime = v.duration / 2;
}, {once: true});
v.src = src;
"""

# What a page's fetch of the link gets (CORS lets it read the status), and the element's error.
FAIL = """
const [src, done] = arguments;
const v = document.getElementById('v');
const answer = fetch(src).then(r => r.status, e => 'fetch failed: ' + e);
v.addEventListener('error', () => answer.then(status =>
  done({status, code: v.error.code, message: v.error.message, readyState: v.readyState})));
v.addEventListener('loadedmetadata', () => done({status: 'loaded', duration: v.duration}));
setTimeout(() => done({status: 'timeout'}), 20000);
v.src = src;
"""


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def page_origin() -> Iterator[str]:
    """A page on its own origin (another port: another origin to the browser)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def web(settings, sessions, broker, tmp_path, page_origin) -> Iterator[str]:
    """The production web server with signing keys and the page's origin allowed."""
    env = {"GENQUEUE_MEDIA_URL_KEYS": MEDIA_KEY, "GENQUEUE_CORS_ORIGINS": f'["{page_origin}"]'}
    with gunicorn_web(settings, tmp_path / "gunicorn.log", **env) as base:
        yield base


@pytest.fixture
def browser(tmp_path) -> Iterator[Any]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={tmp_path / 'chromium'}",
    ):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


# (models, params): the echo models (solid frames, instant) through the real worker, and the real
# ones (SmolLM2 then Wan-tiny, minutes on a CPU). Either way the video stage encodes with libx264.
PIPELINES = {
    "echo": ({}, {"width": 128, "height": 128, "num_frames": 49, "fps": 8, "steps": 2, "seed": 3}),
    "real": (
        {"text_model": "smollm2", "video_model": "wan-tiny", "worker_preload": "text,video"},
        {"width": 256, "height": 256, "num_frames": 17, "fps": 8, "steps": 4, "seed": 7},
    ),
}


@pytest.fixture(params=list(PIPELINES))
def clip(request, settings, web, api_key, sessions, broker) -> Iterator[tuple[str, dict[str, Any]]]:
    """(the signed link, the params) of a finished video job that a real worker ran."""
    from tasks.celery_app import create_celery
    from tasks.lifecycle import preload_models
    from tests.support.workers import in_process_worker

    models, params = PIPELINES[request.param]
    worker_settings = settings.model_copy(update=models)
    if models:
        preload_models(worker_settings)
    auth = {"Authorization": f"Bearer {api_key}"}
    with in_process_worker(create_celery(worker_settings, set_as_current=False), concurrency=2):
        body = {"prompt": "a red fox running in the snow", "modality": "video", "params": params}
        job = httpx.post(f"{web}/v1/jobs", json=body, headers=auth, timeout=10).json()

        def finished() -> dict[str, Any] | None:
            got: dict[str, Any] = httpx.get(f"{web}/v1/jobs/{job['id']}", headers=auth, timeout=10).json()
            return got if got["status"] in ("succeeded", "failed", "canceled") else None

        done = wait_for(finished, 300, 0.2, "the video job")
    assert done["status"] == "succeeded", done
    link: str = done["outputs"]["video_signed_url"]
    assert link.startswith(f"{web}/v1/media/{job['id']}/video?")
    yield link, params


def test_chromium_plays_and_seeks_a_signed_video_from_another_origin(
    browser, page_origin, clip, tmp_path: Path
) -> None:
    video_link, params = clip
    # What the video stage wrote: H.264 (libx264, yuv420p) in MP4, fetched through the link.
    mp4 = tmp_path / "clip.mp4"
    mp4.write_bytes(httpx.get(video_link, timeout=30).content)
    with av.open(str(mp4)) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.codec_context.pix_fmt) == ("h264", "yuv420p")
    browser.get(page_origin)
    got = browser.execute_async_script(PLAY, video_link)
    assert "failed" not in got, got
    assert got["duration"] == pytest.approx(params["num_frames"] / params["fps"], abs=0.2), got
    assert (got["width"], got["height"]) == (params["width"], params["height"]), got
    assert abs(got["seekedTo"] - got["duration"] / 2) < 0.5, got
    assert got["playedTo"] > got["seekedTo"] + 0.3, got


def test_chromium_gets_no_video_from_a_tampered_link(browser, page_origin, clip) -> None:
    video_link, _ = clip
    path, _, query = video_link.partition("?")
    expires, sig = (kv.split("=", 1)[1] for kv in query.split("&"))
    forged = f"{path}?expires={expires}&sig={sig[:-3]}abc"
    browser.get(page_origin)
    got = browser.execute_async_script(FAIL, forged)
    assert got["status"] == 403, got
    assert got["code"] == 4, got  # MEDIA_ERR_SRC_NOT_SUPPORTED: no playable bytes came
    later = f"{path}?expires={int(expires) + 3600}&sig={sig}"  # a longer life than was signed
    assert browser.execute_async_script(FAIL, later)["status"] == 403
