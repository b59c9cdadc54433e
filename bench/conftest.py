"""Provenance for every benchmark JSON (``--benchmark-json results/bench/<name>-<UTC time>.json``): pytest-benchmark
records the machine, the git commit and the date; this adds the torch build, the thread count and the load."""

import os

import torch


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["torch_version"] = torch.__version__
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["cpu_count"] = os.cpu_count()
    machine_info["loadavg"] = os.getloadavg()
    machine_info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
