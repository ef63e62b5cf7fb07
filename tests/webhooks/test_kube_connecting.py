"""Finding the cluster the way kubectl does: --kubeconfig, KUBECONFIG, ~/.kube/config, in-cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio import client

from deviceshare.kube import connecting
from tests import kubeconfigs
from tests.webhooks import fakeapi
from tests.webhooks.test_command import kubeconfig_for


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    return home


async def server_of(kubeconfig: str | None = None) -> str:
    return str((await connecting.configuration(kubeconfig)).host)


async def test_precedence(clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(connecting.ClusterNotFound):
        await connecting.configuration()
    (clean_env / ".kube").mkdir()
    kubeconfig_for("http://home:1", clean_env / ".kube" / "config")
    assert await server_of() == "http://home:1"
    env_file = kubeconfig_for("http://env:2", tmp_path / "env-config")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{env_file}")
    assert await server_of() == "http://env:2"
    flag_file = kubeconfig_for("http://flag:3", tmp_path / "flag-config")
    assert await server_of(str(flag_file)) == "http://flag:3"
    with pytest.raises(connecting.ClusterNotFound):
        await connecting.configuration(str(tmp_path / "nope"))


async def test_in_cluster_only_without_kubeconfig(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert connecting.in_cluster()
    # No service-account token in this test process: the in-cluster loader says so.
    with pytest.raises(Exception, match=r"[Ss]ervice"):
        await connecting.configuration()
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for("http://env:2", tmp_path / "c")))
    assert await server_of() == "http://env:2"


async def test_api_client_reaches_the_cluster(
    clean_env: Path, tmp_path: Path, fake_api: fakeapi.FakeApi
) -> None:
    fake_api.put(fakeapi.GROUPS, fakeapi.group("ml", "trainer"))
    async with await connecting.api_client(str(kubeconfig_for(fake_api.url, tmp_path / "c"))) as api:
        listed = await client.CustomObjectsApi(api).list_cluster_custom_object(
            "deviceshare.io", "v1alpha1", "shareddevicegroups"
        )
    assert [i["metadata"]["name"] for i in listed["items"]] == ["trainer"]


async def test_with_two_files_the_first_current_context_wins(clean_env: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """client-go's merge, which every command connects through (operator, webhook, node agent, inspect, explain,
    demo): the first file that sets current-context decides it; kubernetes_asyncio's own lets the last one win."""
    monkeypatch.setenv("KUBECONFIG", kubeconfigs.first_of_two(kubeconfig_for("http://first:1", tmp_path / "k"),
                                                              tmp_path, namespace="team-a"))
    assert await server_of() == "http://first:1"
    assert connecting.current_context() == ("fake", "team-a")
    assert await server_of(str(tmp_path / "b")) == kubeconfigs.NOWHERE  # one file named: its own context
