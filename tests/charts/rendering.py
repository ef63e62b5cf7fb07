"""The chart rendered by the real ``helm template``, and the kustomize files rendered from it.

The chart (``charts/deviceshare``) is the one source of the install's objects. ``make manifests`` runs
:func:`write` to render, from the very templates Helm installs, the kustomize base's resource files
(``manifests/base/<template>.yaml``) and the cert-manager overlay's ``certificates.yaml``:
``webhook.certificates=external`` (the overlays bring the certificate), ``crds.enabled=false`` (the base
takes ``crds/`` directly), Helm's own labels left out. It also copies into the chart's ``files/`` the
sources the chart reads: ``crds/shareddevicegroups.yaml``, ``monitoring/alerts.yaml`` and
``monitoring/dashboards/*.json`` (copies, not links: Helm reports every link it follows on every command, and
a chart of plain files works wherever it is copied). :func:`stale` tells which committed files differ
from a fresh rendering or copy; tests/charts fails on any. Files of the base that no template renders
(``kustomization.yaml``, ``namespace.yaml``) are kustomize's own and written by hand.

``python -m tests.charts.rendering`` rewrites the files (``--check``: only reports stale ones).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.charts import helm_binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "deviceshare"
NAMESPACE = "deviceshare-system"
RELEASE = "deviceshare"
# Values that turn the chart into the kustomize base: the overlays add the certificate, crds/ the CRD.
BASE_VALUES = {"webhook.certificates": "external", "crds.enabled": "false"}
HEADER = ("# Generated from charts/deviceshare/templates/{template} by `make manifests`: "
          "edit the template, not this file.\n")
_HELM_ONLY = re.compile(r"^\s*(app\.kubernetes\.io/managed-by: Helm|helm\.sh/chart: \S+)\n", re.MULTILINE)
_SOURCE = re.compile(r"^# Source: [^/]+/templates/(\S+)\n", re.MULTILINE)


class HelmError(RuntimeError):
    """helm exited non-zero."""


def helm(*args: str, cwd: Path = ROOT, check: bool = True, env: Mapping[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm_binary.ensure()), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False, env=None if env is None else dict(env))
    if check and proc.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def template_text(values: Mapping[str, str] | None = None, *extra: str) -> str:
    """``helm template`` of the chart as installed in deviceshare-system, with ``--set`` values."""
    sets = [f"--set={k}={v}" for k, v in (values or {}).items()]
    return helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *sets, *extra).stdout


def objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_template(text: str) -> dict[str, list[str]]:
    """The rendered documents grouped by the template that made them, in Helm's order."""
    grouped: dict[str, list[str]] = {}
    for doc in ("\n" + text).split("\n---\n"):
        found = _SOURCE.search(doc)
        if found is None or not yaml.safe_load(doc):
            continue
        body = _HELM_ONLY.sub("", _SOURCE.sub("", doc)).strip("\n") + "\n"
        grouped.setdefault(found.group(1), []).append(body)
    return grouped


def _file(template: str, docs: Sequence[str]) -> str:
    return HEADER.format(template=template) + "---\n".join(docs)


def rendered_files() -> dict[Path, str]:
    """Repository path -> the content ``make manifests`` writes there."""
    files = {
        ROOT / "manifests" / "base" / template: _file(template, docs)
        for template, docs in by_template(template_text(BASE_VALUES)).items()
    }
    cert_manager = by_template(template_text({**BASE_VALUES, "webhook.certificates": "cert-manager"},
                                             "--show-only", "templates/certificates.yaml"))
    files[ROOT / "manifests" / "overlays" / "cert-manager" / "certificates.yaml"] = _file(
        "certificates.yaml", cert_manager["certificates.yaml"])
    # The kustomize components: the node agent (nodeAgent.enabled) and the MPS daemon (mps.enabled); the MPS
    # component's switches on the operator, the webhook and the agent are kustomize patches beside it.
    agent = {**BASE_VALUES, "nodeAgent.enabled": "true"}
    for values, template, folder in ((agent, "node-agent.yaml", ("node-agent",)),
                                     ({**agent, "mps.enabled": "true"}, "mps-daemon.yaml", ("overlays", "mps"))):
        docs = by_template(template_text(values, "--show-only", f"templates/{template}"))[template]
        files[ROOT.joinpath("manifests", *folder, template)] = _file(template, docs)
    return {**files, **chart_sources()}


def chart_sources() -> dict[Path, str]:
    """The chart's ``files/`` copies of the files it reads -> their sources' content."""
    sources = [ROOT / "crds" / "shareddevicegroups.yaml", ROOT / "monitoring" / "alerts.yaml",
               *sorted((ROOT / "monitoring" / "dashboards").glob("*.json"))]
    return {CHART / "files" / source.relative_to(ROOT): source.read_text() for source in sources}


def stale() -> list[Path]:
    """Committed files that differ from what the chart renders now."""
    return [path for path, text in rendered_files().items()
            if not path.is_file() or path.read_text() != text]


def write() -> list[Path]:
    changed = stale()
    for path, text in rendered_files().items():
        if path in changed:
            path.write_text(text)
    return changed


def main(argv: Sequence[str]) -> int:
    changed = stale() if "--check" in argv else write()
    for path in changed:
        print(f"{'stale' if '--check' in argv else 'wrote'}: {path.relative_to(ROOT)}")
    return 1 if changed and "--check" in argv else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
