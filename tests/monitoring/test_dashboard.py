"""The fleet dashboard: the committed JSON is what the builder makes, it has CONTRACT §11's variables, every
panel reads the chosen data source, says what it shows, and is described in docs/monitoring.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from monitoring.dashboards import fleet

from monitoring import objects

ROOT = Path(__file__).resolve().parents[2]
MONITORING_DOC = ROOT / "docs" / "monitoring.md"


def committed() -> dict[str, Any]:
    model: dict[str, Any] = json.loads((ROOT / "monitoring" / "dashboards" / "fleet.json").read_text())
    return model


def test_every_generated_file_is_current() -> None:
    for path, text in objects.rendered().items():
        assert path.exists() and path.read_text() == text, (
            f"{path.relative_to(ROOT)} is not what monitoring/ builds: run `make monitoring` and commit it")


def test_the_contract_variables() -> None:
    variables = {v["name"]: v for v in committed()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("node", "resource"):
        v = variables[name]
        assert v["type"] == "query" and v["includeAll"] and v["multi"] and v["allValue"] == ".*"
        assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_every_panel_reads_the_chosen_data_source_and_explains_itself() -> None:
    panels = [p for p in committed()["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in committed()["panels"]}) == len(committed()["panels"])
    doc = MONITORING_DOC.read_text()
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel.get("description"), panel["title"]
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"]), panel["title"]
        assert f"**{panel['title']}**" in doc, f"docs/monitoring.md does not describe the panel {panel['title']!r}"


def test_the_questions_of_the_issue_each_lead_to_a_panel() -> None:
    """docs/monitoring.md's question -> panel table names panels that exist."""
    titles = {p["title"] for p in committed()["panels"]}
    doc = MONITORING_DOC.read_text()
    table = doc.split("## Questions and where to look", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| question")]
    assert len(rows) >= 7
    for row in rows:
        named = [cell.strip().strip("*") for cell in row.split("|")[2].split(";")]
        assert named and all(n in titles for n in named), row


def test_jobs_match_what_the_monitors_name() -> None:
    jobs = {m["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["replacement"] for m in objects.pod_monitors()}
    assert jobs == {fleet.OPERATOR_JOB, fleet.WEBHOOK_JOB}
