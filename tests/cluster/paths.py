"""Where the test cluster's inputs and state live."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO_ROOT / ".cluster"
# Written by tests/cluster/build.sh.
BIN_DIR = Path(os.environ.get("CLUSTER_BIN_DIR", CLUSTER_DIR / "bin"))
KUBERAY_CRDS_DIR = BIN_DIR / "crds"
MANIFESTS_DIR = BIN_DIR / "manifests"
# The repo's own CRDs (make crds).
CRDS_DIR = REPO_ROOT / "crds"
# `kubecluster.py up`: the detached cluster's state.
PIDS_FILE = CLUSTER_DIR / "pids"
STATE_DIR = CLUSTER_DIR / "state"
KUBECONFIG_FILE = CLUSTER_DIR / "kubeconfig"


def _volumes_dir() -> Path:
    """Where the world's jobs keep data and checkpoints (hostPath volumes: pods see these paths as they are).

    Never under /tmp: the operator gives Ray pods an emptyDir there and refuses mount paths in it.
    """
    if CLUSTER_DIR.resolve().is_relative_to("/tmp"):
        return Path("/var/tmp") / f"rocmtrain-volumes-{os.getuid()}"
    return CLUSTER_DIR / "volumes"


# The demo's folder and the end-to-end tests' folders (each made, and removed, by its user).
VOLUMES_DIR = _volumes_dir()
