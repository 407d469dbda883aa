"""Gunicorn settings for the web process (`gunicorn -c ops/gunicorn.conf.py 'app:create_app()'`)."""
import multiprocessing
import os
import shutil
import tempfile


def _log_config():
    from models import logs
    from models.settings import Settings

    settings = Settings()
    return logs.logging_config(settings.log_format, settings.log_level)


bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8000')}"
# A greenlet per connection (gevent), not a thread: idle, slow-header and slow-body clients cost
# a few KB each instead of a request thread (docs/RELIABILITY.md, "Hostile connections").
# app.server.HardenedGeventWorker adds the body deadline and problem+json protocol errors.
worker_class = "app.server.HardenedGeventWorker"
workers = int(os.environ.get("WEB_CONCURRENCY", multiprocessing.cpu_count()))
# Open connections per worker process; past it the process stops accepting and new clients
# wait in the listen backlog. Each one needs a file descriptor (the limit is raised below).
worker_connections = int(os.environ.get("WEB_CONNECTIONS", "4000"))
backlog = 2048
timeout = 60
graceful_timeout = 30
# With the gevent worker this is also the deadline for a request line and its headers to
# arrive, on a new connection as between keep-alive requests: a silent or trickling client is
# closed after it. The body has GENQUEUE_WEB_BODY_TIMEOUT_S (408 after it).
keepalive = 5
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190
# Recycle workers now and then so slow leaks cannot grow without bound.
max_requests = 20000
max_requests_jitter = 2000
# Any value turns it on (off by default: it costs throughput); its lines go to the one handler below.
accesslog = os.environ.get("GUNICORN_ACCESS_LOG")
errorlog = "-"
# gunicorn's own lines (and the access log when on) go through the processes' one log setup:
# JSON or text (GENQUEUE_LOG_FORMAT), the request id, secrets masked. models.logs and
# models.settings import neither SQLAlchemy nor Flask, which must wait for gevent's patching.
logger_class = "app.server.Logger"
logconfig_dict = _log_config()

# Pooled database connections per worker process: greenlets queue for one (a request holds it
# only while its statements run), so the pool bounds Postgres load, not concurrency. No overflow:
# an overflow connection is closed as soon as it is returned to a full pool, so under steady load
# each request past the pool opened a fresh one (a Postgres backend started and torn down, and
# the client's connect): measured, that doubled a poll's server CPU (docs/BENCHMARKS.md). The
# same 20 connections at most as before (10 + 10 overflow), all kept. At most this many
# `Prefer: wait` submits per process are held open (each costs a greenlet).
os.environ.setdefault("GENQUEUE_DB_POOL_SIZE", "20")
os.environ.setdefault("GENQUEUE_DB_MAX_OVERFLOW", "0")
os.environ.setdefault("GENQUEUE_MAX_WAITERS", "64")


# Metrics across worker processes (app/metrics.py, docs/OPERATIONS.md): prometheus-client keeps
# each process's values in files under PROMETHEUS_MULTIPROC_DIR and /metrics sums them, so a
# scrape sees every worker, dead ones' counts included. The master sets the directory up before
# any worker forks (the library reads the variable when a worker first imports it); the
# workers never import prometheus_client before that, the app loads after the fork.
_METRICS_DIR_PREFIX = "genqueue-web-metrics-"  # the private directory, removed when the master exits


def _own_metrics_dir(path: str) -> bool:
    # Told by its name, not remembered: a SIGHUP re-reads this file, module state included.
    name = os.path.basename(path)
    return os.path.dirname(path) == tempfile.gettempdir() and name.startswith(_METRICS_DIR_PREFIX)


def _setup_metrics_dir() -> None:
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    # A private one, nothing another server left there can be counted; also when the variable
    # names the private directory of the master that started this one (a USR2 re-exec): the old
    # master's workers still write there, and it removes the directory when it exits.
    if not given or _own_metrics_dir(given):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix=_METRICS_DIR_PREFIX)
        return
    # Given by the operator: emptied, since values of an earlier run would add to this one's.
    os.makedirs(given, mode=0o700, exist_ok=True)
    for name in os.listdir(given):
        if name.endswith(".db"):
            os.unlink(os.path.join(given, name))


def on_starting(server):  # gunicorn's hook signature
    """Raise the open-files limit (every held connection is a descriptor); set up the metrics dir."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    _setup_metrics_dir()


def child_exit(server, worker):
    """A worker ended (recycled, killed, crashed): drop its live-gauge files. Its counter and
    histogram files stay, so what it counted is still in every scrape."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    if path and _own_metrics_dir(path):
        shutil.rmtree(path, ignore_errors=True)
