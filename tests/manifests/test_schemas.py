"""Every object the install renders is one the API server would accept.

Core kinds are checked strictly against the Kubernetes schemas; custom resources against the
CRD that serves them; cert-manager's kinds (whose CRDs are not ours) structurally.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.manifests import kube_objects

CERT_MANAGER_GROUP = "cert-manager.io"

# cert-manager v1 fields this project uses, with their types; any other field is a typo here.
_ISSUER_REF = {
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                   "group": {"const": CERT_MANAGER_GROUP}},
}
_CERT_MANAGER_SPECS: dict[str, dict[str, Any]] = {
    "Issuer": {
        "type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
        "properties": {
            "selfSigned": {"type": "object"},
            "ca": {"type": "object", "required": ["secretName"], "additionalProperties": False,
                   "properties": {"secretName": {"type": "string"}}},
        },
    },
    "Certificate": {
        "type": "object", "required": ["secretName", "issuerRef"], "additionalProperties": False,
        "properties": {
            "secretName": {"type": "string"},
            "issuerRef": _ISSUER_REF,
            "isCA": {"type": "boolean"},
            "commonName": {"type": "string", "maxLength": 64},
            "dnsNames": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "duration": {"type": "string", "pattern": r"^\d+h$"},
            "renewBefore": {"type": "string", "pattern": r"^\d+h$"},
            "usages": {"type": "array", "items": {"enum": [
                "digital signature", "key encipherment", "server auth", "client auth", "cert sign"]}},
            "privateKey": {
                "type": "object", "additionalProperties": False,
                "properties": {"algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                               "size": {"type": "integer"},
                               "rotationPolicy": {"enum": ["Never", "Always"]}},
            },
        },
    },
}


def _validate_cert_manager(obj: kube_objects.KubeObject) -> None:
    assert obj["apiVersion"] == f"{CERT_MANAGER_GROUP}/v1", kube_objects.ref(obj)
    assert obj["metadata"].get("namespace"), f"{kube_objects.ref(obj)}: Issuer/Certificate are namespaced"
    jsonschema.validate(obj["spec"], _CERT_MANAGER_SPECS[obj["kind"]])


def _validate_all(objects: list[kube_objects.KubeObject]) -> list[str]:
    """Validate every object; return how each was checked (so a test can see nothing was skipped)."""
    crds = kube_objects.crds_by_kind(objects)
    how = []
    for obj in objects:
        if kube_objects.group_of(obj) == CERT_MANAGER_GROUP:
            _validate_cert_manager(obj)
            how.append("cert-manager")
        elif kube_objects.is_core_kind(obj):
            kube_objects.validate_core(obj)
            how.append("kubernetes")
        else:
            kube_objects.validate_custom(obj, crds)
            how.append("crd")
    return how


def test_base_objects_are_valid(base_objects: list[kube_objects.KubeObject]) -> None:
    how = _validate_all(base_objects)
    assert how.count("crd") == 0  # every object is a core kind (the group CRD itself included)


def test_cert_manager_overlay_objects_are_valid(cert_manager_objects: list[kube_objects.KubeObject]) -> None:
    how = _validate_all(cert_manager_objects)
    assert how.count("cert-manager") == 4


def test_self_signed_overlay_objects_are_valid(self_signed: Any) -> None:
    _validate_all(self_signed.objects)


@pytest.mark.parametrize(("kind", "mutate"), [
    ("Deployment", lambda o: o["spec"]["template"]["spec"].update(serviceAcountName="typo")),
    ("Deployment", lambda o: o["spec"].update(replicas="two")),
    ("MutatingWebhookConfiguration", lambda o: o["webhooks"][0].update(failurePolicy=5)),
    ("Service", lambda o: o["spec"]["ports"][0].update(port="https")),
    ("ClusterRole", lambda o: o["rules"][0].update(verb=["get"])),
])
def test_validation_catches_broken_objects(
    base_objects: list[kube_objects.KubeObject], kind: str, mutate: Any
) -> None:
    """The checks above can fail: a typo or wrong type in a core object is rejected."""
    broken = copy.deepcopy(kube_objects.select(base_objects, kind)[0])
    mutate(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kube_objects.validate_core(broken)


def test_custom_resource_validation_catches_a_bad_group(base_objects: list[kube_objects.KubeObject]) -> None:
    crds = kube_objects.crds_by_kind(base_objects)
    bad = {"apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup",
           "metadata": {"name": "g", "namespace": "ml"},
           "spec": {"resources": {"nvidia.com/gpu": 0}}}
    with pytest.raises(jsonschema.ValidationError):
        kube_objects.validate_custom(bad, crds)


def test_every_namespaced_object_lives_in_deviceshare_system(
    base_objects: list[kube_objects.KubeObject],
) -> None:
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                      "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for obj in base_objects:
        ns = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert ns is None, kube_objects.ref(obj)
        else:
            assert ns == "deviceshare-system", kube_objects.ref(obj)


def test_every_object_is_labelled_as_part_of_deviceshare(
    cert_manager_objects: list[kube_objects.KubeObject],
) -> None:
    """`kubectl get all -A -l app.kubernetes.io/part-of=deviceshare` finds the whole install."""
    for obj in cert_manager_objects:
        assert obj["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "deviceshare", \
            kube_objects.ref(obj)
