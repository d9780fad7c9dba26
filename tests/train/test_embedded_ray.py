"""The embedded Ray of `rocmtrain run` is its own, beside any other Ray this machine names."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# In a process of its own: the tests' Ray is already started in this one.
PROBE = """
import json, os, signal
import ray
from rocmtrain_train.driver.train_job import start_embedded_ray

def stop(signum, frame):  # `rocmtrain run`'s, as rocmtrain_train.driver.stop_signals sets it
    raise KeyboardInterrupt

signal.signal(signal.SIGTERM, stop)
options = {"address": "local", "num_cpus": 1, "num_gpus": 0, "include_dashboard": False}
start_embedded_ray({**options, "dashboard_port": 8265})

@ray.remote
def environment():
    return {name: os.environ.get(name) for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}

seen = {"ray_process": ray.get(environment.remote()), "driver": os.environ.get("RAY_ADDRESS")}
seen["sigterm_kept"] = signal.getsignal(signal.SIGTERM) is stop
ray.shutdown()
print(json.dumps(seen))
"""


def test_ray_processes_are_told_the_dashboard_and_no_other_cluster():
    """Ray's processes inherit the environment from its start: they find the embedded Ray's dashboard,
    and not the cluster `RAY_ADDRESS` names (Ray Train's processes would ask that one's state API);
    the driver's own environment is as it was, and so is its SIGTERM handler (ray.init sets its own, which
    would end `rocmtrain run` without stopping the run as Ctrl-C does)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, "RAY_ADDRESS": "127.0.0.1:1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen == {
        "ray_process": {"RAY_ADDRESS": None, "RAY_API_SERVER_ADDRESS": "http://127.0.0.1:8265"},
        "driver": "127.0.0.1:1",
        "sigterm_kept": True,
    }
