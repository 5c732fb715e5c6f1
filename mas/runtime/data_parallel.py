"""Data parallel: one policy trained by N workers (``policies.<name>.workers: N``, Ray runtime).

A documented actor group rather than Ray Train: the N workers are ordinary policy actors (each
a ``PolicyWorker`` with the whole policy), because they must stay alive between steps, serve
rollouts (rank 0) and checkpoint like any other policy actor, which Ray Train's
run-a-training-function model does not fit.  The group is a torch.distributed process group
over TCP, rank 0's address: gloo on CPU, NCCL on GPU.

Per update the driver deals the policy's turns round-robin into N shards.  Each worker
computes its shard's loss with the divisor of the whole batch (token or turn count, summed
over the group), then the learner sums the gradients and the loss statistics over the group
before clipping (``Learner.sync``).  The summed gradient is the one-worker gradient of the
whole batch, so every worker clips by the same norm and takes the same step, and the weights
stay identical on all workers, equal to the one-worker update up to float summation order.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist


class TorchDistributedSync:
    """``GradientSync`` over a torch.distributed group: one all-reduce (sum) per dtype per call."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def max_(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for group in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in group])  # [sum of numels]
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for t in group:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()


def free_address() -> tuple[str, int]:
    """This node's address and a free TCP port on it (rank 0 hosts the group's rendezvous)."""
    try:
        import ray

        host = ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray: this machine
        host = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        return host, s.getsockname()[1]


def join_group(address: str, port: int, rank: int, world_size: int, device: torch.device) -> TorchDistributedSync:
    """Join (rank 0: host) the process group of one policy's workers; blocks until all have joined."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world_size, timeout=timedelta(minutes=30)
        )
    return TorchDistributedSync(world_size)
