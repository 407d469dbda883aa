"""Real worker processes and throwaway Redis/Postgres/RabbitMQ resources for the kill and outage tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from models.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def wait_for(check: Callable[[], Any], timeout: float = 60, interval: float = 0.1, what: str = "") -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_env(settings: Settings, **extra: Any) -> dict[str, str]:
    """The environment a worker subprocess reads its Settings from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENQUEUE_")}
    env |= {
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": settings.database_url,
        "BROKER_URL": settings.broker_url,
        "HF_HUB_OFFLINE": "1",
    }
    for field in (
        "artifact_dir", "text_model", "video_model", "retry_backoff_s", "retry_backoff_max_s",
        "progress_interval_s", "broker_visibility_timeout_s", "broker_restore_interval_s",
        "max_retries", "max_stage_attempts", "infra_backoff_s", "infra_backoff_max_s",
        "video_soft_time_limit_s", "video_time_limit_s", "worker_held_dir",
    ):  # fmt: skip
        env[f"GENQUEUE_{field.upper()}"] = str(getattr(settings, field))
    env |= {k: str(v) for k, v in extra.items()}
    return env


@dataclass
class Gunicorn:
    """A running gunicorn master: its base URL, process and log file."""

    base: str
    proc: subprocess.Popen[bytes]
    log: Path


@contextmanager
def gunicorn(settings: Settings, log: Path, *args: str, workers: int = 1, **env: Any) -> Iterator[Gunicorn]:
    """The production web server (ops/gunicorn.conf.py) on a free port, up once every worker booted.

    `args` go to gunicorn's command line; `env` overrides the environment (None: unset)."""
    import httpx

    port = free_port()
    penv = worker_env(
        settings, HOST="127.0.0.1", PORT=port, WEB_CONCURRENCY=workers, GENQUEUE_LOG_FORMAT="text"
    )
    for key, value in env.items():
        if value is None:
            penv.pop(key, None)
        else:
            penv[key] = str(value)
    cmd = [
        sys.executable,
        "-m",
        "gunicorn",
        "-c",
        str(ROOT / "ops/gunicorn.conf.py"),
        *args,
        "app:create_app()",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=penv, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        if workers > 1 and log.read_text().count("Booting worker") < workers:
            return False
        try:
            return httpx.get(f"{base}/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 60, what="gunicorn")
        yield Gunicorn(base, proc, log)
    finally:
        proc.terminate()
        proc.wait(30)


@contextmanager
def gunicorn_web(settings: Settings, log: Path, *args: str, **env: Any) -> Iterator[str]:
    """gunicorn (above) with one worker unless `workers=` says otherwise; its base URL."""
    with gunicorn(settings, log, *args, **env) as server:
        yield server.base


class Worker:
    """`celery -A tasks.worker worker` as a subprocess, logging to a file."""

    def __init__(
        self,
        env: dict[str, str],
        queues: str,
        log_dir: Path,
        name: str = "w",
        pool: str = "prefork",
        concurrency: int = 1,
        gossip: bool = False,
        supervised: bool = False,
        quiet: bool = False,
    ) -> None:
        self.env, self.queues, self.pool, self.concurrency = env, queues, pool, concurrency
        # The Procfile's workers run with gossip and mingle (their own broker consumers and
        # timers); most tests leave them out to start faster.
        self.gossip = gossip
        # `genqueue worker ...` (app.supervise) as the Procfile runs it: self.pid is the
        # supervisor, its child the Celery worker, restarted when it exits unexpectedly.
        self.supervised = supervised
        self.quiet = quiet  # no startup banner (plain text), as the Procfile's workers
        self.name = f"{name}-{uuid.uuid4().hex[:6]}"
        self.log = Path(log_dir) / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90) -> Worker:
        args = [
            "-Q", self.queues, "-P", self.pool, "-c", str(self.concurrency), "-n", f"{self.name}@%h",
            "-l", "INFO",
        ]  # fmt: skip
        if not self.gossip:
            args += ["--without-gossip", "--without-mingle"]
        if self.supervised:
            cmd = [sys.executable, "-m", "app.cli", "worker", *args]
        else:
            quiet = ["--quiet"] if self.quiet else []
            cmd = [sys.executable, "-m", "celery", "-A", "tasks.worker", *quiet, "worker", *args]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        wait_for(self._ready, timeout, 0.2, f"worker {self.name} to start (log {self.log})")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker {self.name} exited: {self.log_text()[-3000:]}")
        return " ready." in self.log_text()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def pool_children(self) -> list[psutil.Process]:
        return psutil.Process(self.pid).children()

    def alive(self) -> bool:
        """The worker process (supervised: the supervisor and a Celery child) is running."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        if not self.supervised:
            return True
        return any(p.status() != psutil.STATUS_ZOMBIE for p in self.pool_children())

    def restarts(self) -> int:
        """How many times the supervisor restarted the Celery worker (app.supervise's log line)."""
        return self.log_text().count("worker exited with status")

    def crashes(self) -> int:
        """Celery's own `Unrecoverable error` lines: exits that supervision had to catch."""
        return self.log_text().count("Unrecoverable error")

    def kill(self) -> None:
        """SIGKILL the worker and its pool children at once: nothing gets to ack or restore."""
        procs = [psutil.Process(self.pid), *self.pool_children()]
        for p in procs:
            p.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        children = self.pool_children()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        psutil.wait_procs(children, timeout=5)
        for child in children:
            if child.is_running():
                child.kill()


def _run_as_postgres(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.run(cmd, check=True, capture_output=True, **kw)


def pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if found:
        return found[-1].parent
    exe = shutil.which("pg_ctl")
    return Path(exe).parent if exe else None


class RedisServer:
    """A private redis-server on a free port, with an append-only file so a restart keeps the queues."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        cmd = [
            "redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.dir),
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(port=self.port, socket_connect_timeout=1)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.exceptions.RedisError:
                return False

        wait_for(up, 30, 0.1, "redis-server to start")
        client.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: redis flushes the append-only file and exits
            self.proc.wait(timeout=30)


class MotoServer:
    """moto's S3 API server (`python -m moto.server`) on a free port: a real S3 endpoint over HTTP.

    S3_UPLOAD_PART_MIN_SIZE is lowered so a test's multipart upload needs a few hundred KiB,
    not AWS's 5 MiB a part.
    """

    REGION = "us-east-1"
    KEY_ID, SECRET = "genqueue-test-key", "genqueue-test-secret"

    def __init__(self, log: Path, part_min_size: int = 64 << 10) -> None:
        self.port = free_port()
        self.log, self.part_min_size = Path(log), part_min_size
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client(
            "s3", endpoint_url=self.url, region_name=self.REGION,
            aws_access_key_id=self.KEY_ID, aws_secret_access_key=self.SECRET,
        )  # fmt: skip

    def start(self) -> MotoServer:
        env = {**os.environ, "S3_UPLOAD_PART_MIN_SIZE": str(self.part_min_size)}
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"moto.server exited: {self.log.read_text(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for(up, 60, 0.1, "moto.server to start")
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class PostgresServer:
    """A private Postgres cluster in a temp directory on a free port (pg_ctl)."""

    def __init__(self) -> None:
        self.bin = pg_bin()
        self.port = free_port()
        # Its own top-level temp dir: the postgres user must be able to reach it.
        self.dir = Path(tempfile.mkdtemp(prefix="gq-pg-"))
        self.data = self.dir / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/genqueue"

    def _ctl(self, *args: str) -> None:
        assert self.bin is not None
        _run_as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), *args], timeout=120)

    def init(self) -> PostgresServer:
        assert self.bin is not None
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        _run_as_postgres(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"],
            timeout=120,
        )
        return self

    def start(self) -> PostgresServer:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl("-o", opts, "-l", str(self.dir / "pg.log"), "-w", "-t", "60", "start")
        return self

    def stop(self) -> None:
        self._ctl("-m", "fast", "-w", "-t", "60", "stop")

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class RabbitVhost:
    """A private vhost on the machine's RabbitMQ (guest), deleted afterwards."""

    def __init__(self) -> None:
        self.name = f"gq_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:5672/{self.name}"

    def create(self) -> RabbitVhost:
        subprocess.run(["rabbitmqctl", "add_vhost", self.name], check=True, capture_output=True, timeout=60)
        subprocess.run(
            ["rabbitmqctl", "set_permissions", "-p", self.name, "guest", ".*", ".*", ".*"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        return self

    def delete(self) -> None:
        subprocess.run(["rabbitmqctl", "delete_vhost", self.name], capture_output=True, timeout=60)


class RabbitNode:
    """A private RabbitMQ node (own node name, AMQP and distribution ports, data dir) to restart.

    The machine's shared node (rabbit@localhost, 5672) is never touched: this one reads its own
    config file (the shared one binds 5672) and enables no plugins (management would bind 15672).
    """

    SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")

    def __init__(self, workdir: Path) -> None:
        self.port, self.dist_port = free_port(), free_port()
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.node = f"gq{os.getpid()}x{uuid.uuid4().hex[:6]}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def available(cls) -> bool:
        return cls.SERVER.exists()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _env(self) -> dict[str, str]:
        (self.dir / "node.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        (self.dir / "plugins").write_text("[].\n")
        return os.environ | {
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "node.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "plugins"),
            "RABBITMQ_CONF_ENV_FILE": "/dev/null",  # the shared node's env file names its node
        }

    def start(self, timeout: float = 120) -> RabbitNode:
        with open(self.dir / "server.log", "ab") as out:
            self.proc = subprocess.Popen(
                [str(self.SERVER)], env=self._env(), stdout=out, stderr=subprocess.STDOUT
            )
        from kombu import Connection

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"rabbitmq-server exited: see {self.dir / 'server.log'}")
            try:
                with Connection(self.url, connect_timeout=1) as conn:
                    conn.connect()
                return True
            except Exception:
                return False

        wait_for(up, timeout, 0.5, "the private RabbitMQ node to start")
        return self

    def stop(self) -> None:
        """SIGTERM to the node's VM (a clean stop: durable queues and messages kept)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pid_file = self.dir / "pid"
        if pid_file.exists() and pid_file.read_text().strip():
            try:
                os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
            except ProcessLookupError:
                pass
        else:
            self.proc.terminate()
        self.proc.wait(timeout=60)


def rabbitmq_available() -> bool:
    if not shutil.which("rabbitmqctl"):
        return False
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False
