"""`make run-operator` beside `make cluster-up`: which cluster it serves, and the pid file `down` reads.

No cluster runs here: the pid file and kubeconfig are files in a temporary folder,
and the "running" processes are this test's own (`sleep`), found as `down` finds
them (`processes.is_ours`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rocmtrain_testworld import kubecluster


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    pids, kubeconfig = tmp_path / "pids", tmp_path / "kubeconfig"
    monkeypatch.setattr(kubecluster, "PIDS_FILE", pids)
    monkeypatch.setattr(kubecluster, "KUBECONFIG_FILE", kubeconfig)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    yield pids, kubeconfig


def test_record_replaces_the_operator_that_runs(files):
    pids, _ = files
    pids.write_text("etcd 11 etcd\nrocm-train-operator 12 rocmtrain.controller\nkueue 13 kueue\n")
    kubecluster._record("rocm-train-operator", 99, "rocmtrain.controller")
    assert pids.read_text().splitlines() == [
        "etcd 11 etcd",
        "kueue 13 kueue",
        "rocm-train-operator 99 rocmtrain.controller",
    ]


def test_run_operator_serves_the_local_world_only_when_kubeconfig_names_it(files, monkeypatch, tmp_path):
    pids, kubeconfig = files
    assert not kubecluster._serves_local_world()  # no world
    with subprocess.Popen(["sleep", "30"]) as apiserver:
        try:
            pids.write_text(f"kube-apiserver {apiserver.pid} sleep\n")
            kubeconfig.write_text("{}")
            assert kubecluster._serves_local_world()  # KUBECONFIG unset
            monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
            assert kubecluster._serves_local_world()
            monkeypatch.setenv("KUBECONFIG", str(tmp_path / "elsewhere.kubeconfig"))
            assert not kubecluster._serves_local_world()  # another cluster: the plain operator
        finally:
            apiserver.kill()
    monkeypatch.delenv("KUBECONFIG")
    assert not kubecluster._serves_local_world()  # the world's apiserver is gone
