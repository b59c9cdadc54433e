"""Analytic performance model: FLOPs, bytes, communication, memory and iteration time of large-model training.

One formula per file, each citing its paper (see DESIGN.md). Entry points:

* ``flops``: ``gpt_flops_per_iteration`` (96 B s l h^2 ...), ``gpt_param_count`` (MT-NLG closed form);
* ``collectives`` / ``parallel_comm``: ring volumes, TP / PP / DP / ZeRO communication per iteration;
* ``hardware``: accelerators, links, clusters (DGX-2H V100, DGX A100) as frozen dataclasses;
* ``step_time``: iteration time of tp x pp x dp GPT training (roofline ops + collectives + pipeline);
* ``megatron`` / ``mtnlg``: the papers' configurations, calibration and predictions;
* ``zero_infinity``: ZeRO-Infinity memory requirements and bandwidth-efficiency relation;
* ``cpu``: ``calibrate_cpu()`` and ``predict_cpu_step_time()`` for this machine.
"""
