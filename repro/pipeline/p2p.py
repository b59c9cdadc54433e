"""Point-to-point transfers between neighbouring pipeline stages (Megatron's send_forward / recv_backward ...).

Activations flow to stage ``r + 1``, their gradients back to ``r - 1``, over the pipeline group ``groups.pp``
(whose members share the tensor- and data-parallel coordinates, so every tp rank talks to its tp twin).
Sends are non-blocking (``isend``): a stage never waits for its successor to take the tensor, so the per-stage
1F1B orders execute as a dataflow and cannot deadlock; the handles are kept and waited at the end of the step.
Receives block, and the time spent waiting in them is the pipeline's idle time. Everything goes through
:mod:`repro.dist.comm`, so the ledger counts every transfer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from repro.dist import comm
from repro.dist.comm import CommGroup


@dataclass
class P2PChannel:
    """One stage's links to its neighbours in ``group``; remembers pending sends and time spent receiving."""

    group: CommGroup
    pending: list = field(default_factory=list)
    recv_wait_s: float = 0.0

    @property
    def is_first(self) -> bool:
        return self.group.rank == 0

    @property
    def is_last(self) -> bool:
        return self.group.rank == self.group.size - 1

    def _send(self, tensor: torch.Tensor, peer: int) -> None:
        tensor = tensor.detach().contiguous()
        self.pending.append((comm.isend(tensor, self.group, peer), tensor))  # keep the buffer alive until sent

    def _recv(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, peer: int) -> torch.Tensor:
        buffer = torch.empty(shape, dtype=dtype, device=device)
        start = time.perf_counter()
        comm.irecv(buffer, self.group, peer).wait()
        self.recv_wait_s += time.perf_counter() - start
        return buffer

    def send_forward(self, activation: torch.Tensor) -> None:
        """Activation of this stage -> input of the next."""
        self._send(activation, self.group.rank + 1)

    def recv_forward(self, shape, dtype, device) -> torch.Tensor:
        return self._recv(tuple(shape), dtype, device, self.group.rank - 1)

    def send_backward(self, input_grad: torch.Tensor) -> None:
        """Gradient w.r.t. this stage's input -> gradient of the previous stage's output."""
        self._send(input_grad, self.group.rank - 1)

    def recv_backward(self, shape, dtype, device) -> torch.Tensor:
        return self._recv(tuple(shape), dtype, device, self.group.rank + 1)

    def wait_sends(self) -> None:
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
