"""Protobuf bodies typed clients send: a delete's ``DeleteOptions`` (helm uninstall sends one per release
Secret) is honoured like its JSON form; a kind the sandbox cannot decode is a 415, never a silent guess."""

from __future__ import annotations

import aiohttp

from deviceshare.sandbox import Sandbox, protobuf

PROTOBUF = "application/vnd.kubernetes.protobuf"


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def _field(number: int, value: bytes | int) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _field(1, api_version.encode()) + _field(2, kind.encode())
    return protobuf.MAGIC + _field(1, type_meta) + _field(2, raw)


def test_delete_options_decode_every_field() -> None:
    raw = (_field(1, 0) + _field(2, _field(1, b"uid-1") + _field(2, b"42")) + _field(3, 1)
           + _field(4, b"Background") + _field(5, b"All"))
    assert protobuf.decode(envelope("meta.k8s.io/v1", "DeleteOptions", raw)) == {
        "apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
        "preconditions": {"uid": "uid-1", "resourceVersion": "42"}, "orphanDependents": True,
        "propagationPolicy": "Background", "dryRun": ["All"],
    }
    negative = protobuf.decode(envelope("v1", "DeleteOptions", _field(1, -1)))
    assert negative["gracePeriodSeconds"] == -1


async def test_a_protobuf_delete_is_honoured_with_its_preconditions(sandbox: Sandbox) -> None:
    sandbox.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"}})
    uid = sandbox.get("secrets", "s", "default")["metadata"]["uid"]
    url = f"{sandbox.url}/api/v1/namespaces/default/secrets/s"
    async with aiohttp.ClientSession() as session:
        wrong = envelope("meta.k8s.io/v1", "DeleteOptions", _field(2, _field(1, b"other-uid")))
        async with session.delete(url, data=wrong, headers={"Content-Type": PROTOBUF}) as r:
            assert r.status == 409
        dry = envelope("meta.k8s.io/v1", "DeleteOptions", _field(5, b"All"))
        async with session.delete(url, data=dry, headers={"Content-Type": PROTOBUF}) as r:
            assert r.status == 200
        assert sandbox.get("secrets", "s", "default") is not None
        right = envelope("meta.k8s.io/v1", "DeleteOptions",
                         _field(2, _field(1, uid.encode())) + _field(4, b"Background"))
        async with session.delete(url, data=right, headers={"Content-Type": PROTOBUF}) as r:
            assert r.status == 200
    assert sandbox.get("secrets", "s", "default") is None


async def test_a_kind_it_cannot_decode_is_unsupported_media_type(sandbox: Sandbox) -> None:
    body = envelope("apps/v1", "Deployment", _field(1, _field(1, b"d")))
    async with aiohttp.ClientSession() as session, session.post(
        f"{sandbox.url}/apis/apps/v1/namespaces/default/deployments", data=body, headers={"Content-Type": PROTOBUF}
    ) as r:
        assert r.status == 415
        assert (await r.json())["reason"] == "UnsupportedMediaType"


async def test_a_custom_resource_in_protobuf_is_refused_as_kube_apiserver_refuses_it(sandbox: Sandbox) -> None:
    body = envelope("deviceshare.io/v1alpha1", "SharedDeviceGroup", _field(1, _field(1, b"g")))
    async with aiohttp.ClientSession() as session, session.post(
        f"{sandbox.url}/apis/deviceshare.io/v1alpha1/namespaces/default/shareddevicegroups", data=body,
        headers={"Content-Type": PROTOBUF},
    ) as r:
        assert r.status == 415
        assert (await r.json())["message"] == ("the body of the request was in an unknown format - accepted media "
                                               "types include: application/json, application/yaml")
