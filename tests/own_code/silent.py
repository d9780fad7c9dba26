"""Reports nothing: records the environment contract it is given, on the driver and (under Ray) on a worker."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from rocmtrain_train import sdk

PREFIXES = ("ROCMTRAIN_", "KUBEFLOW_")


def contract() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith(PREFIXES) and name != "ROCMTRAIN_JOB"}


if __name__ == "__main__":
    seen = {"driver": contract(), "argv": sys.argv[1:]}
    if "--in-driver" not in sys.argv[1:]:
        import ray

        seen["worker"] = ray.get(ray.remote(num_cpus=1)(contract).remote())
    run = Path(sdk.storage_path())
    run.mkdir(parents=True, exist_ok=True)
    (run / "contract.json").write_text(json.dumps(seen, indent=1))
