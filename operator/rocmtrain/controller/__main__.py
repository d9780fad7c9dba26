"""Run the operator: `python -m rocmtrain.controller` (configured by `ROCMTRAIN_*` variables)."""

from __future__ import annotations

import kopf

from rocmtrain.controller import handlers  # noqa: F401 - registers the handlers
from rocmtrain.controller.settings import OperatorConfig


def main() -> None:
    """Run kopf with the handlers, JSON logs, and the namespaces and probe port from the environment."""
    config = OperatorConfig.from_env()
    kopf.configure(log_format=kopf.LogFormat.JSON)
    kopf.run(
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        standalone=True,
        liveness_endpoint=config.liveness_endpoint,
    )


if __name__ == "__main__":
    main()
