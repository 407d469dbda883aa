"""ops/prometheus and ops/grafana: the alert rules and the dashboard parse, pass their unit tests, and
name only metrics Genqueue exports."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.prometheus import (
    CONFIG,
    DASHBOARD,
    RULE_TESTS,
    RULES,
    check_expressions,
    dashboard_expressions,
    exported_names,
    metric_names_in,
    promtool,
    rule_expressions,
)

needs_promtool = pytest.mark.skipif(
    promtool() is None, reason="promtool not installed (bin/services installs it)"
)
ALERTS = {
    "GenqueueSubmitSlow",
    "GenqueueQueueGrowing",
    "GenqueueJobFailureRatioHigh",
    "GenqueueQueueWithoutConsumer",
    "GenqueueWebhookBacklog",
    "GenqueueWebhooksOverdue",
    "GenqueueReaperRecovering",
    "GenqueueReaperFailingJobs",
    "GenqueueGpuMemoryHigh",
    "GenqueueExporterSourceDown",
    "GenqueueTargetDown",
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    assert tool is not None
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent)


@needs_promtool
def test_rules_and_config_check() -> None:
    rules = _run("check", "rules", str(RULES))
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = _run("check", "config", str(CONFIG))
    assert config.returncode == 0, config.stdout + config.stderr


@needs_promtool
def test_rule_unit_tests_pass() -> None:
    result = _run("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_for_severity_and_annotations() -> None:
    import yaml

    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for rule in rules:
        assert rule.get("for"), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    tested = RULE_TESTS.read_text()
    for alert in ALERTS:  # each one shown firing (an expected alert) and not firing (an empty list)
        assert f"alertname: {alert}\n        exp_alerts:\n          - exp_labels" in tested, alert
        assert f"alertname: {alert}\n        exp_alerts: []" in tested, alert


@needs_promtool
def test_every_expression_parses(tmp_path) -> None:
    expressions = rule_expressions() | dashboard_expressions()
    result = check_expressions(expressions, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(expressions)} rules found" in result.stdout


def test_a_broken_expression_is_refused(tmp_path) -> None:
    if promtool() is None:
        pytest.skip("promtool not installed")
    result = check_expressions({"x": "sum by (queue (genqueue_queue_depth)"}, tmp_path)
    assert result.returncode != 0


def test_expressions_name_only_exported_metrics(settings) -> None:
    exported = exported_names(settings)
    # The definitions are where the names come from: a few that must be among them.
    assert {
        "genqueue_http_requests_total",
        "genqueue_queue_wait_seconds_bucket",
        "genqueue_queue_depth",
        "genqueue_worker_consuming",
        "genqueue_gpu_memory_total_bytes",
        "genqueue_exporter_up",
    } <= exported
    for where, expressions in (("rules", rule_expressions()), ("dashboard", dashboard_expressions())):
        for name, expr in expressions.items():
            used = metric_names_in(expr)
            assert used, f"{where} {name}: no metric in {expr!r}"
            assert used <= exported | {"up"}, f"{where} {name}: {sorted(used - exported)} not exported"


def test_name_extraction_ignores_strings_and_functions() -> None:
    expr = 'sum by (le) (rate(genqueue_x_bucket{endpoint="/v1/genqueue_not_a_metric"}[5m])) > on() up'
    assert metric_names_in(expr) == {"genqueue_x_bucket", "up"}


def test_dashboard_shape() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert 36 <= dash["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    used = set().union(*(metric_names_in(e) for e in dashboard_expressions().values()))
    for metric in (
        "genqueue_queue_depth",
        "genqueue_queue_wait_seconds_bucket",
        "genqueue_stage_duration_seconds_bucket",
        "genqueue_job_duration_seconds_bucket",
        "genqueue_jobs_finished_total",
        "genqueue_jobs_submitted_total",
        "genqueue_http_problems_total",
        "genqueue_webhook_deliveries_pending",
        "genqueue_webhook_attempts_total",
        "genqueue_gpu_memory_reserved_bytes",
        "genqueue_gpu_memory_total_bytes",
    ):
        assert metric in used, metric
