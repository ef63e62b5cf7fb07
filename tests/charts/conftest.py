"""Renderings of the chart, made once per session with the real (pinned) Helm."""

from __future__ import annotations

from typing import Any

import pytest

from tests.charts import rendering
from tests.manifests.conftest import cert_manager_objects, self_signed  # noqa: F401  (the kustomize renderings)

MODES = ("self-signed", "cert-manager", "external")


@pytest.fixture(scope="session")
def chart_objects() -> dict[str, list[dict[str, Any]]]:
    """``helm template`` with the defaults, per ``webhook.certificates`` mode."""
    return {mode: rendering.objects(rendering.template_text({"webhook.certificates": mode})) for mode in MODES}
