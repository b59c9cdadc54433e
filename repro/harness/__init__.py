"""The machinery that runs experiments, apart from the experiments themselves (``repro.experiments``).

* :mod:`~repro.harness.runner`: one point on this machine (ranks spawned with gloo or nccl), its rows written;
* :mod:`~repro.harness.worker`: ``python -m repro.harness.worker EXP --point P``, what a Slurm step runs;
* :mod:`~repro.harness.resources` and :mod:`~repro.harness.machine_fit`: what a point needs, whether it fits here;
* :mod:`~repro.harness.sbatch` and :mod:`~repro.harness.submit`: batch files and ``repro submit``;
* :mod:`~repro.harness.reproduce`: ``repro reproduce``, ``repro claims`` and ``repro figures``;
* :mod:`~repro.harness.zero_report`: ``repro zero-report``, where a ZeRO rank's memory goes.
"""
