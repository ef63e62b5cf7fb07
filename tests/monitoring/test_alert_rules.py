"""monitoring/alerts.yaml: promtool accepts it, its unit tests pass, and every alert is one an on-call engineer
can act on (severity, summary, description, a runbook section that exists, a unit test that makes it fire)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.monitoring import prometheus

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "monitoring" / "alerts.yaml"
UNIT_TESTS = ROOT / "monitoring" / "alerts_test.yaml"
RUNBOOKS = ROOT / "docs" / "troubleshooting.md"


def alerts() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([prometheus.binary("promtool"), *args], capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = promtool("test", "rules", str(UNIT_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_unit_test_that_makes_it_fire() -> None:
    cases = [case for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    fired = {case["alertname"] for case in cases if case.get("exp_alerts")}
    assert {a["alert"] for a in alerts()} <= fired


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as dashes."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_alert_says_how_bad_what_and_where_its_runbook_is() -> None:
    anchors = _anchors(RUNBOOKS.read_text())
    for alert in alerts():
        name = alert["alert"]
        assert alert["labels"]["severity"] in {"critical", "warning"}, name
        notes = alert["annotations"]
        assert notes["summary"] and notes["description"], name
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "docs/troubleshooting.md", name
        assert anchor == name.lower() and anchor in anchors, f"{name}: no section '### {name}' in {RUNBOOKS.name}"
