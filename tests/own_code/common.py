"""What the test scripts share: run a training function in the driver (`--in-driver`) or under Ray Train."""

from __future__ import annotations

import sys
from collections.abc import Callable

from rocmtrain_train import sdk


def main(train_func: Callable[[], None]) -> None:
    if "--in-driver" in sys.argv[1:]:
        train_func()
        return
    from ray.train.torch import TorchTrainer

    TorchTrainer(train_func, scaling_config=sdk.scaling_config(), run_config=sdk.run_config()).fit()
