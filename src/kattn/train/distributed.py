"""One process or many under ``torchrun`` (DistributedDataParallel: gloo on CPU, NCCL on GPU).

``torchrun`` sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; without them the run is a single
process. Every process sees its share of each global batch; rank 0 writes the run folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Processes:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """The element-wise sum of ``values`` over the processes."""
        if not self.distributed:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor)
        return tensor.tolist()


def processes_from_env() -> Processes:
    """The processes as ``torchrun`` describes them in the environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Processes()
    return Processes(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


#: the devices a run can name.
DEVICES = "auto, cpu, cuda, cuda:N (N a GPU index) or mps"
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")


def check_device(name: str, what: str = "device") -> str:
    """``name`` if it is one of :data:`DEVICES`, else a ``ValueError`` naming ``what`` (the
    flag or config key that gave it)."""
    if not isinstance(name, str) or not _DEVICE.fullmatch(name):
        raise ValueError(f"{what} must be {DEVICES}, got {name!r}")
    return name


def resolve_device(name: str, processes: Processes, what: str = "device") -> torch.device:
    """``auto`` → CUDA when available, else CPU; each process its own GPU. A device that is
    not one of :data:`DEVICES`, or not available here, raises a ``ValueError``."""
    check_device(name, what)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{what} 'mps' asked for, but MPS is not available; use cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{what} {name!r} asked for, but CUDA is not available; use cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"{what} {name!r}: this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}"
            )
        if processes.distributed or device.index is None:
            device = torch.device("cuda", processes.local_rank)
        torch.cuda.set_device(device)
    return device


def init_processes(processes: Processes, device: torch.device) -> bool:
    """Join the process group (once) when the run is distributed; True when this call joined."""
    if processes.distributed and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=processes.rank, world_size=processes.world_size)
        return True
    return False


def close_processes() -> None:
    """Leave the process group, so that no communication thread outlives the run (a process
    that exits with one still running aborts)."""
    if dist.is_initialized():
        dist.destroy_process_group()
