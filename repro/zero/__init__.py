"""ZeRO (Rajbhandari et al. 2019): partitioning math, stages 1-3, offload tiers, memory model."""
