"""The CRD is a valid CustomResourceDefinition for the Kubernetes versions we support.

kubernetes-validate carries the real OpenAPI schemas of each Kubernetes release; strict mode
also rejects fields the API server would drop silently (a typo'd key in a schema).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "shareddevicegroups.yaml"
# CRD validation rules (CEL) are GA since 1.29; check the oldest we support and the newest known.
VERSIONS = ["1.29.0", "1.32.0", kubernetes_validate.latest_version()]


def load() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


@pytest.mark.parametrize("version", VERSIONS)
def test_crd_is_valid(version: str) -> None:
    kubernetes_validate.validate(load(), version, strict=True)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "versions", 0, "schema", "openAPIV3Schema", "propertes"), {}),  # typo
        (("spec", "versions", 0, "served"), "yes"),
        (("spec", "names", "shortNames"), "sdg"),
    ],
)
def test_a_broken_crd_is_rejected(path: tuple[str | int, ...], value: Any) -> None:
    body = copy.deepcopy(load())
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(body, VERSIONS[-1], strict=True)
