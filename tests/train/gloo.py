"""Real ranks for the sharding tests, without Ray: processes joined by torch.distributed over gloo on loopback."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CPU = torch.device("cpu")

# The processes come from a fork server that imported these once: each starts in a fraction of a second, and
# none inherits the threads of this process (a fork of the test process itself could deadlock in OpenMP).
mp.set_forkserver_preload(
    ["torch", "torch.distributed.fsdp", "transformers", "peft", "rocmtrain_train.strategy.sharded"]
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(rank: int, world: int, port: int, fn, args) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def spawn(world: int, fn, *args) -> None:
    """Run `fn(rank, world, *args)` in `world` processes joined by gloo on loopback."""
    mp.start_processes(_run, args=(world, _free_port(), fn, args), nprocs=world, join=True, start_method="forkserver")
