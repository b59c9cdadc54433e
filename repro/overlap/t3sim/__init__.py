"""An analytic model of the GPU T3 simulates (T3, Pati et al., ASPLOS'24, sec. 5), to reproduce its simulated
results on a CPU as ``repro.gna.simulator`` does for GNA.

One concept per file: ``hardware`` (the GPU as data), ``gemm`` (tiles, waves, HBM traffic with L2 reuse),
``ring`` (ring reduce-scatter / all-gather: link, DRAM, CU throughput), ``schedules`` (sequential, ideal, T3,
T3-MCA, CU-split), ``workloads`` (T3's models, TP degrees, sublayers, tokens), ``endtoend`` (a whole layer from
the performance model's op list), ``fit`` (the three fitted constants and the claims they are fitted on),
``cpu`` (the same schedules predicting this machine's CPU measurement of the overlapped layers, from components
measured by ``cpu_components``).
"""

from .fit import Fit, fit, geomean
from .hardware import T3_GPU, T3Gpu
from .schedules import Sublayer, SublayerResult, cu_split, simulate_sublayer

__all__ = ["Fit", "Sublayer", "SublayerResult", "T3Gpu", "T3_GPU", "cu_split", "fit", "geomean", "simulate_sublayer"]
