"""Where the test cluster's inputs and state live."""

from __future__ import annotations

import hashlib
import os
import tomllib
from pathlib import Path

PROJECT = "rocm-train-operator"


def _checkout(start: Path) -> Path:
    """The rocm-train-operator checkout holding ``start``: the package is installed editable from
    ``tests/testworld`` in it, and the world reads the checkout's CRDs, manifests and examples."""
    for folder in start.parents:
        project = folder / "pyproject.toml"
        if project.is_file() and tomllib.loads(project.read_text()).get("project", {}).get("name") == PROJECT:
            return folder
    raise RuntimeError(f"{start} is not inside a {PROJECT} checkout (install rocmtrain_testworld editable from it)")


REPO_ROOT = _checkout(Path(__file__).resolve())
CLUSTER_DIR = REPO_ROOT / ".cluster"
# Written by build.sh (beside this module).
BIN_DIR = Path(os.environ.get("CLUSTER_BIN_DIR", CLUSTER_DIR / "bin"))
KUBERAY_CRDS_DIR = BIN_DIR / "crds"
MANIFESTS_DIR = BIN_DIR / "manifests"
# The repo's own CRDs (make crds).
CRDS_DIR = REPO_ROOT / "crds"
# `kubecluster.py up`: the detached cluster's pids and kubeconfig (its state: STATE_DIR).
PIDS_FILE = CLUSTER_DIR / "pids"
KUBECONFIG_FILE = CLUSTER_DIR / "kubeconfig"
# `kubecluster.py up`: its S3 server's variables, for a person to `source` (s3.S3Server.env_file).
S3_ENV_FILE = CLUSTER_DIR / "s3.env"


def outside_tmp(cluster_dir: Path, name: str) -> Path:
    """A folder of a checkout's cluster state that is never under /tmp (``.cluster/<name>``, or one of
    that checkout's own in /var/tmp where it lies in /tmp): pods of the process runtime see this
    machine's paths, and the operator gives Ray pods an emptyDir at /tmp, which hides whatever lies
    below it.
    """
    real = cluster_dir.resolve()
    if real.is_relative_to("/tmp"):
        checkout = hashlib.sha256(str(real).encode()).hexdigest()[:8]
        return Path("/var/tmp") / f"rocmtrain-{name}-{os.getuid()}-{checkout}"
    return cluster_dir / name


# Where the world's jobs keep data and checkpoints (hostPath volumes: pods see these paths as they
# are; the operator refuses mount paths under /tmp). The demo's folder and the end-to-end tests'
# folders (each made, and removed, by its user).
VOLUMES_DIR = outside_tmp(CLUSTER_DIR, "volumes")
# Where the worlds keep their state (etcd, logs, the process runtime's pod folders, which must stay
# visible below a pod's /tmp mount): `kubecluster.py up`'s, and the fresh folders of those started
# without a workdir (the tests' session world).
STATE_DIR = outside_tmp(CLUSTER_DIR, "state")
WORLDS_DIR = outside_tmp(CLUSTER_DIR, "worlds")
