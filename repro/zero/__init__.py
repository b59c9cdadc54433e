"""ZeRO stages 0-3 (Rajbhandari et al. 2019) and ZeRO-Offload/Infinity tiers (cpu, nvme), built by wrapping an
optimizer: ``build_zero_optimizer(model, ZeroConfig(stage=2), dp_group=groups.dp, lr=1e-4)``.

Files: partition.py (shard arithmetic), stage0-3.py (one idea each), param_units.py (stage-3 gathering),
inner.py (the wrapped optimizer over tiers), offload/ (tiers), precision.py, grad_norm.py, ledger.py (measured
memory), checkpoint.py (sharded, atomic), reshard.py (a checkpoint to another dp size). ZeRO works on any
``nn.Module`` and imports no model: the papers' closed forms are in ``repro/perfmodel/zero_memory.py`` and
``zero_residual.py``, the harness that measures ZeRO in ``repro/experiments/zero_measure.py``, and ``repro
zero-report`` in ``repro/harness/zero_report.py``.
"""

from repro.zero.build import STAGE_CLASSES, build_zero_optimizer
from repro.zero.config import LossScaleConfig, OffloadConfig, ZeroConfig
from repro.zero.ledger import MemoryLedger
from repro.zero.stage0 import DataParallelOptimizer
from repro.zero.stage1 import ZeroStage1
from repro.zero.stage2 import ZeroStage2
from repro.zero.stage3 import ZeroStage3

__all__ = [
    "STAGE_CLASSES", "DataParallelOptimizer", "LossScaleConfig", "MemoryLedger", "OffloadConfig", "ZeroConfig",
    "ZeroStage1", "ZeroStage2", "ZeroStage3", "build_zero_optimizer",
]
