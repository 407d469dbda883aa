"""Prometheus in tests: the metric names Genqueue exports, PromQL checks through promtool, a real server."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client import CollectorRegistry

from models.settings import Settings
from tests.support.procs import ROOT, free_port, wait_for

RULES = ROOT / "ops" / "prometheus" / "genqueue-rules.yml"
RULE_TESTS = ROOT / "ops" / "prometheus" / "genqueue-rules.test.yml"
CONFIG = ROOT / "ops" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "genqueue.json"
BUILTIN = {"up"}  # what Prometheus itself records per target
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
# Grafana's interval variables, as a 1-minute scrape would give them.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def _series_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def exported_names(settings: Settings) -> set[str]:
    """Every series name the web app, the workers and the exporter can export, from their definitions."""
    from app.exporter import ExporterCollector
    from app.metrics import Metrics
    from tasks import metrics as worker_metrics

    names = _series_names(Metrics().registry)
    worker_metrics.gpu_gauges()  # created on first use (CUDA workers, the webhook relay)
    worker_metrics.webhook_overdue_jobs()
    names |= _series_names(worker_metrics.metrics().registry)
    registry = CollectorRegistry()
    collector = ExporterCollector(settings)  # its families exist only in a scrape: read the test's db
    registry.register(collector)
    try:
        names |= _series_names(registry)
    finally:
        collector.close()
    return names


def promtool() -> str | None:
    return shutil.which("promtool")


def rule_expressions() -> dict[str, str]:
    """{alert name: expression} of genqueue-rules.yml."""
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def dashboard_expressions() -> dict[str, str]:
    """{"panel title / refId": expression} of the Grafana dashboard, its interval variables filled in."""
    out = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            out[f"{panel['title']} / {target['refId']}"] = expr
    return out


_IDENTIFIER = re.compile(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def metric_names_in(expr: str) -> set[str]:
    """The genqueue_* and built-in series an expression selects (label values and strings left out)."""
    bare = _STRING.sub('""', expr)
    return {n for n in _IDENTIFIER.findall(bare) if n.startswith("genqueue_") or n in BUILTIN}


def check_expressions(expressions: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` over the expressions as recording rules: it parses each one."""
    rules = [{"record": f"check:expression_{i}", "expr": e} for i, e in enumerate(expressions.values())]
    path = tmp / "expressions.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "expressions", "rules": rules}]}))
    tool = promtool()
    assert tool is not None
    return subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


_FOR = re.compile(r"^(\s+for:\s*)\S+\s*$", re.M)


def rules_with_for(path: Path, duration: str) -> Path:
    """A copy of genqueue-rules.yml with every `for:` set to `duration` (a test cannot wait minutes)."""
    text, n = _FOR.subn(lambda m: m.group(1) + duration, RULES.read_text())
    assert n == len(rule_expressions())
    path.write_text(text)
    return path


class PrometheusServer:
    """`prometheus` on a free local port, scraping `jobs` ({job name: [host:port]}) every second."""

    def __init__(self, tmp: Path, jobs: dict[str, Iterable[str]], rules: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {"job_name": name, "static_configs": [{"targets": list(targets)}]}
                for name, targets in jobs.items()
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = tmp / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [shutil.which("prometheus") or "prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for(self._ready, 30, 0.2, "Prometheus to be ready")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query: {sorted labels: value}."""
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert body["status"] == "success", body
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in body["data"]["result"]}

    def value(self, expr: str) -> float | None:
        """The single value of an instant query (None for an empty result)."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return next(iter(result.values()), None)

    def alerts(self) -> list[dict[str, Any]]:
        body = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()
        assert body["status"] == "success", body
        alerts: list[dict[str, Any]] = body["data"]["alerts"]
        return alerts

    def firing(self, name: str) -> list[dict[str, str]]:
        return [
            a["labels"] for a in self.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"
        ]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
