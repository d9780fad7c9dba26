"""TEST-ONLY: the process runtime,
`python -m rocmtrain_testworld.runtime --kubeconfig K --folder DIR --logs DIR --names DIR --image CHECKOUT`.

Stops (every pod, then the pod network) on SIGTERM or SIGINT. Its folders may not lie under /tmp: a
pod's /tmp is an emptyDir (the operator's Ray pods have one), which would hide from the pod's own
mounts the files they bind (its names, volumes, the copy of the image it binds back).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from rocmtrain_testworld.api import KubeCluster
from rocmtrain_testworld.runtime import INFO_FILE, PROCESS_NODES
from rocmtrain_testworld.runtime.container import ensure_ray_tmp
from rocmtrain_testworld.runtime.kubelet import Kubelet
from rocmtrain_testworld.runtime.network import Network, available
from rocmtrain_testworld.sandbox import LoopbackNames


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rocmtrain_testworld.runtime", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--folder", type=Path, required=True, help="the pods' folders and runtime.json go here")
    parser.add_argument(
        "--logs", type=Path, required=True, help="container logs: LOGS/<namespace>/<pod>/<container>.log"
    )
    parser.add_argument("--names", type=Path, required=True, help="the world's name sandbox folder")
    parser.add_argument(
        "--image", type=Path, required=True, help="the checkout that stands in for the image (with this Python)"
    )
    parser.add_argument("--nodes", default=",".join(PROCESS_NODES))
    args = parser.parse_args(argv)
    if under_tmp := [str(f) for f in (args.folder, args.logs, args.names) if f.resolve().is_relative_to("/tmp")]:
        parser.error(f"folders under /tmp, which a pod's /tmp hides from its own mounts: {', '.join(under_tmp)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    if reason := available():
        print(f"error: {reason}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    args.folder.mkdir(parents=True, exist_ok=True)
    ensure_ray_tmp()
    network = Network().up()
    try:
        kubelet = Kubelet(
            KubeCluster(args.kubeconfig),
            args.folder,
            args.logs,
            args.nodes.split(","),
            LoopbackNames(args.names),
            network,
            Path(sys.prefix) / "bin",
            args.image,
        )
        kubelet.start()
        info = {
            "pid": os.getpid(),
            "hostAddress": network.host_address,
            "subnet": str(network.subnet),
            "nodes": [n.name for n in kubelet.nodes],
        }
        (args.folder / INFO_FILE).write_text(json.dumps(info))
        logging.info("process runtime up: %s", info)
        stop.wait()
        logging.info("stopping every pod")
        kubelet.shutdown()
    finally:
        network.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
