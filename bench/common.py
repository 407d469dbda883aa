"""Shared benchmark helpers: per-run database and Redis db, servers, workers, the load client, results."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("GENQUEUE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_HOST = os.environ.get("GENQUEUE_TEST_REDIS", "redis://127.0.0.1:6379")
# The same lease keys as tests/conftest.py, so benchmarks and test runs never share a Redis db.
LEASE_KEY = "genqueue:test-db-lease:{}"


# --- numbers -------------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) with linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass(frozen=True)
class Result:
    """One measured figure next to its side-by-side baseline."""

    bench: str
    metric: str
    value: float
    baseline: float
    unit: str
    goal: str = ""
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        return self.value / self.baseline if self.baseline else float("nan")

    def line(self) -> str:
        goal = f"  (goal: {self.goal})" if self.goal else ""
        return (
            f"{self.bench:<9} {self.metric:<26} {self.value:>10.2f} {self.unit:<12} "
            f"baseline {self.baseline:>10.2f}  ratio {self.ratio:.2f}x{goal}"
        )


def print_results(results: Sequence[Result]) -> None:
    for r in results:
        print(r.line(), flush=True)


def machine() -> str:
    """One line describing where the numbers were taken."""
    load = os.getloadavg()[0]
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}, load avg {load:.2f} at start"
    )


# --- resources -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def temp_database(prefix: str = "gq_bench") -> Iterator[str]:
    """A fresh Postgres database migrated to head, dropped afterwards."""
    from sqlalchemy import create_engine, text

    from models.migrate import upgrade

    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    try:
        yield url
    finally:
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def temp_redis_db() -> Iterator[str]:
    """A Redis db number no test run or other benchmark holds, emptied before and after."""
    import redis

    leases = redis.Redis.from_url(f"{REDIS_HOST}/0")
    for n in range(1, 16):
        if leases.set(LEASE_KEY.format(n), os.getpid(), nx=True, ex=3600):
            break
    else:
        raise RuntimeError("all Redis dbs 1-15 are leased; remove stale genqueue:test-db-lease:* keys")
    url = f"{REDIS_HOST}/{n}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        leases.delete(LEASE_KEY.format(n))


@contextlib.contextmanager
def private_redis() -> Iterator[tuple[str, psutil.Process]]:
    """A throwaway redis-server on a free port (no persistence), so its CPU is this run's alone."""
    port = free_port()
    popen = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _listens(port), 10, f"redis-server on port {port}")
        yield f"redis://127.0.0.1:{port}/0", psutil.Process(popen.pid)
    finally:
        popen.terminate()
        popen.wait(10)


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def private_postgres() -> Iterator[tuple[str, psutil.Process]]:
    """A Postgres cluster of the run's own (tests.support.procs, pg_ctl; fsync off), migrated;
    yields its URL and its postmaster, whose tree's CPU (cluster_cpu_seconds) is the run's."""
    from models.migrate import upgrade
    from tests.support.procs import PostgresServer

    server = PostgresServer().init().start()
    try:
        upgrade(server.url)
        pid = int((server.data / "postmaster.pid").read_text().split()[0])
        yield server.url, psutil.Process(pid)
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            server.stop()
        server.remove()


def tree_cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU so far of a process, its live descendants, and its exited children
    (reaped children's time accrues to their parent)."""
    own = proc.cpu_times()
    total = own.user + own.system + own.children_user + own.children_system
    return total + cpu_seconds(proc.children(recursive=True))


def cluster_cpu_seconds(postmaster: psutil.Process) -> float:
    """CPU of a Postgres cluster so far: the postmaster, its live backends, and the exited ones
    (short-lived overflow connections count)."""
    return tree_cpu_seconds(postmaster)


def pg_backends(db_url: str) -> list[psutil.Process]:
    """The Postgres server processes serving `db_url`'s database now (one per open connection)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(db_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            pids = (
                conn.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
                .scalars()
                .all()
            )
    finally:
        engine.dispose()
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(psutil.Process(pid))
    return out


# Admission bounds high enough that no throughput benchmark ever meets them (bench/overload.py
# sets its own low ones on purpose): a benchmark measures the path, not the 503 shortcut.
NO_ADMISSION_LIMITS = {
    "GENQUEUE_ADMISSION_MAX_TEXT_BACKLOG": str(10**9),
    "GENQUEUE_ADMISSION_MAX_VIDEO_BACKLOG": str(10**9),
    "GENQUEUE_ADMISSION_MAX_WAIT_S": "0",
}
# A plan with no practical rate limit or quota, for the tenant a throughput benchmark acts as.
UNLIMITED_PLAN = {"rate_limit": "100000000/second", "max_active_jobs": 10**9}


def bench_key(db_url: str, tenant: str | None = None) -> str:
    """A fresh API key in the benchmark's database whose tenant's plan has no practical limits.

    By default the key is the default tenant's: rows a benchmark inserts directly (no tenant_id)
    belong to it, so its pollers may read them.
    """
    from models.db import make_engine, make_session_factory, transaction
    from models.keys import create_key, set_plan
    from models.tenant import DEFAULT_TENANT_NAME

    tenant = tenant or DEFAULT_TENANT_NAME

    engine = make_engine(db_url, pool_size=1)
    try:
        with transaction(make_session_factory(engine)) as s:
            set_plan(s, tenant, UNLIMITED_PLAN)
            return create_key(s, tenant)[1]
    finally:
        engine.dispose()


def auth_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def python_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that imports this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.update(extra)
    return env


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass
class Process:
    """A child process started by a benchmark, with its log file."""

    popen: subprocess.Popen[bytes]
    log: Path

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.popen.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@contextlib.contextmanager
def spawn(args: Sequence[str], env: dict[str, str], name: str) -> Iterator[Process]:
    """Run a child in its own process group; SIGTERM it (then SIGKILL the group) on exit."""
    log = Path(tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    with log.open("wb") as out:
        popen = subprocess.Popen(
            list(args), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    proc = Process(popen, log)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)  # stragglers: pool children, gunicorn workers
        popen.wait(timeout=5)
        log.unlink(missing_ok=True)


@contextlib.contextmanager
def gunicorn(app_spec: str, env: dict[str, str], probe: str = "/") -> Iterator[tuple[str, Process]]:
    """Serve `app_spec` with ops/gunicorn.conf.py on a free loopback port; yields (base URL, process)."""
    import httpx

    port = free_port()
    env = python_env(HOST="127.0.0.1", PORT=str(port), **env)
    # Worker recycling (max_requests) would restart a worker mid-measurement: the trivial app
    # reaches the config's 20,000 requests within one run. Off for both apps alike.
    config = str(ROOT / "ops/gunicorn.conf.py")
    args = [sys.executable, "-m", "gunicorn", "-c", config, "--max-requests", "0", app_spec]
    base = f"http://127.0.0.1:{port}"
    with spawn(args, env, "gunicorn") as proc:

        def up() -> bool:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"gunicorn {app_spec} exited:\n{proc.tail()}")
            try:
                return httpx.get(base + probe, timeout=1).status_code < 500
            except httpx.HTTPError:
                return False

        wait_until(up, 60, f"gunicorn {app_spec}")
        yield base, proc


def rss_mb(procs: Sequence[psutil.Process]) -> float:
    """Resident memory of the given processes together, in MB."""
    return sum(p.memory_info().rss for p in procs) / 2**20


def cpu_seconds(procs: Sequence[psutil.Process]) -> float:
    """User + system CPU the given processes have used so far (0 for one that has exited)."""
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


# --- load client ---------------------------------------------------------------------------------


@dataclass
class Load:
    """What one load run saw: completed requests, their latencies, failures."""

    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    server_cpu: float = 0.0  # CPU seconds the server's workers used meanwhile, when measured
    backend_cpu: float = 0.0  # CPU seconds of its Postgres backends and redis-server meanwhile

    @property
    def cpu_ms(self) -> float:
        """Server CPU per completed request: far less sensitive than rates to a busy machine."""
        return 1000 * self.server_cpu / len(self.latencies) if self.latencies else float("nan")

    @property
    def all_cpu_ms(self) -> float:
        """Web workers + Postgres backends + redis-server CPU per completed request."""
        total = self.server_cpu + self.backend_cpu
        return 1000 * total / len(self.latencies) if self.latencies else float("nan")

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def p(self, q: float) -> float:
        return percentile(self.latencies, q) * 1000  # ms

    def summary(self) -> str:
        return (
            f"{len(self.latencies)} ok, {self.errors} failed in {self.elapsed:.1f} s: "
            f"{self.rate:.0f} req/s, p50 {self.p(50):.1f} ms, p99 {self.p(99):.1f} ms, "
            f"web CPU {self.cpu_ms:.2f} ms/req, server CPU (web + Postgres + Redis) "
            f"{self.all_cpu_ms:.2f} ms/req, statuses {self.statuses}"
        )


# A request is (method, url, json body, its encoded bytes or None); the factory gets a running request number.
RequestFactory = Callable[[int], tuple[str, str, Any]]


async def _load(
    make: RequestFactory,
    concurrency: int,
    duration: float | None,
    requests: int | None,
    ok: set[int],
    headers: dict[str, str] | None,
) -> Load:
    import aiohttp

    result = Load()
    counter = iter(range(10**12))
    deadline = time.monotonic() + duration if duration is not None else float("inf")
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:

        async def client() -> None:
            while time.monotonic() < deadline:
                n = next(counter)
                if requests is not None and n >= requests:
                    return
                method, url, body = make(n)
                started = time.perf_counter()
                try:
                    # bytes go as they are (encoded once: a large body would cost the client each time)
                    sent = {"data": body} if isinstance(body, bytes) else {"json": body}
                    async with session.request(method, url, **sent) as resp:
                        await resp.read()
                        status = resp.status
                except (TimeoutError, aiohttp.ClientError):
                    result.errors += 1
                    continue
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status in ok:
                    result.latencies.append(time.perf_counter() - started)
                else:
                    result.errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        result.elapsed = time.perf_counter() - started
    return result


def run_load(
    make: RequestFactory,
    *,
    concurrency: int = 64,
    duration: float | None = None,
    requests: int | None = None,
    ok: set[int] | None = None,
    headers: dict[str, str] | None = None,
) -> Load:
    """Closed-loop load: `concurrency` keep-alive connections, each sending its next request at once.

    `headers` go with every request (e.g. `auth_headers(key)`).
    """
    if duration is None and requests is None:
        raise ValueError("give a duration or a request count")
    return asyncio.run(_load(make, concurrency, duration, requests, ok or {200, 201, 202}, headers))
