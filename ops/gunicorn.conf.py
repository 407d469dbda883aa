"""Gunicorn settings for the web process (`gunicorn -c ops/gunicorn.conf.py 'app:create_app()'`)."""
import multiprocessing
import os

bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8000')}"
# gthread: threads absorb slow clients (Prefer: wait, downloads) without a process each.
worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY", multiprocessing.cpu_count()))
threads = int(os.environ.get("WEB_THREADS", "8"))
backlog = 2048
timeout = 60
graceful_timeout = 30
keepalive = 5
# Recycle workers now and then so slow leaks cannot grow without bound.
max_requests = 20000
max_requests_jitter = 2000
accesslog = os.environ.get("GUNICORN_ACCESS_LOG")  # off by default: it costs throughput
errorlog = "-"

# One pooled database connection per request thread (plus the Prefer: wait poller and a spare),
# and at most half the threads held by `Prefer: wait` submits. Read by each worker's Settings.
os.environ.setdefault("GENQUEUE_DB_POOL_SIZE", str(threads + 2))
os.environ.setdefault("GENQUEUE_MAX_WAITERS", str(max(1, threads // 2)))
