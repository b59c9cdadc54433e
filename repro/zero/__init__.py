"""ZeRO stages 0-3 (Rajbhandari et al. 2019) and ZeRO-Offload/Infinity tiers (cpu, nvme), built by wrapping an
optimizer: ``build_zero_optimizer(model, ZeroConfig(stage=2), dp_group=groups.dp, lr=1e-4)``.

Files: partition.py (shard arithmetic), stage0-3.py (one idea each), param_units.py (stage-3 gathering),
inner.py (the wrapped optimizer over tiers), offload/ (tiers), precision.py, grad_norm.py, ledger.py (measured
memory), checkpoint.py (sharded, atomic), reshard.py (a checkpoint to another dp size). ZeRO works on any
``nn.Module`` and imports no model: the papers' closed forms are in ``repro/perfmodel/zero_memory.py`` and
``zero_residual.py``, the harness that measures ZeRO in ``repro/experiments/zero_measure.py``, and ``repro
zero-report`` in ``repro/harness/zero_report.py``.

The names load on first use (PEP 562), as in :mod:`repro.dist`: a module that needs one torch-free piece of this
package (its configuration, which experiments declare) does not import torch through this file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from repro.lazy import lazy_names

#: name -> the module that defines it, imported at the name's first use
_HOMES = {
    **dict.fromkeys(("STAGE_CLASSES", "build_zero_optimizer"), "repro.zero.build"),
    **dict.fromkeys(("LossScaleConfig", "OffloadConfig", "ZeroConfig"), "repro.zero.config"),
    **dict.fromkeys(("MemoryLedger",), "repro.zero.ledger"),
    **dict.fromkeys(("DataParallelOptimizer",), "repro.zero.stage0"),
    **dict.fromkeys(("ZeroStage1",), "repro.zero.stage1"),
    **dict.fromkeys(("ZeroStage2",), "repro.zero.stage2"),
    **dict.fromkeys(("ZeroStage3",), "repro.zero.stage3"),
}

__all__ = sorted(_HOMES)

if TYPE_CHECKING:
    from repro.zero.build import STAGE_CLASSES, build_zero_optimizer
    from repro.zero.config import LossScaleConfig, OffloadConfig, ZeroConfig
    from repro.zero.ledger import MemoryLedger
    from repro.zero.stage0 import DataParallelOptimizer
    from repro.zero.stage1 import ZeroStage1
    from repro.zero.stage2 import ZeroStage2
    from repro.zero.stage3 import ZeroStage3


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
