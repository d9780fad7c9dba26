"""How `rocmtrain status` and `rocmtrain pool` end when the cluster read fails (`rocmtrain.cli.cluster`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from rocmtrain.api.errors import NotFound
from rocmtrain.cli import cluster


class FailingCluster:
    """A cluster whose job read raises `error`."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def job(self, namespace: str, name: str) -> dict[str, Any]:
        raise self.error


def _status(monkeypatch: pytest.MonkeyPatch, error: Exception) -> int:
    """`rocmtrain status ml/llama` against a cluster whose job read raises `error`."""

    async def with_cluster(kubeconfig: str | None, work: Callable[[Any], Awaitable[int]]) -> int:
        return await work(FailingCluster(error))

    monkeypatch.setattr(cluster, "_with_cluster", with_cluster)
    return cluster.status(["ml/llama"])


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (NotFound("no RocmTrainingJob ml/llama"), "error: no RocmTrainingJob ml/llama"),
        (ApiException(status=403, reason="Forbidden"), "error: cannot read the cluster: Forbidden"),
        (ConnectionRefusedError("connection refused"), "error: cannot read the cluster: connection refused"),
    ],
)
def test_a_missing_job_a_refusal_or_no_connection_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: Exception, said: str
) -> None:
    assert _status(monkeypatch, error) == cluster.EXIT_FAILED
    assert capsys.readouterr().err == f"{said}\n"


@pytest.mark.parametrize("content", [None, "", "{}", "clusters: [", "users: 3"])
def test_a_missing_or_malformed_kubeconfig_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert cluster.pool([]) == cluster.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith("error: cannot load the cluster's configuration: ") and err.count("\n") == 1, err


def test_a_bug_in_the_cluster_read_surfaces_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A programming error is not reported as "cannot read the cluster": it escapes, traceback and all."""
    with pytest.raises(KeyError, match="items"):
        _status(monkeypatch, KeyError("items"))
    assert "cannot read the cluster" not in capsys.readouterr().err
