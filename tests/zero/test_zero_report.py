"""The memory report: attribution of a measured peak, the fp32/mixed-precision formula, the CLI end to end."""

import json

import pytest

from repro.perfmodel.zero_memory import model_state_bytes
from repro.testing import needs
from repro.harness.zero_report import COLUMNS, attribute, formula_bytes, main, render_markdown, report_frame


def test_formula_bytes_for_each_precision():
    psi = 1000
    for stage in (0, 1, 2, 3):
        assert formula_bytes(psi, stage, 4, "bf16") == model_state_bytes(num_params=psi, stage=stage, dp_size=4)
    # fp32: the parameters are the master weights, 4 + 4 + 8 bytes, partitioned as the stage says
    assert formula_bytes(psi, 0, 4, "fp32") == 16 * psi
    assert formula_bytes(psi, 1, 4, "fp32") == 8 * psi + 8 * psi / 4
    assert formula_bytes(psi, 2, 4, "fp32") == 4 * psi + 12 * psi / 4
    assert formula_bytes(psi, 3, 4, "fp32") == 16 * psi / 4


def test_attribution_adds_up_to_the_peak():
    measurement = {
        "stage": 3, "dp_size": 2, "psi": 1000, "rss_start": 300e6, "rss_peak": 400e6,
        "ledger": {"params/device": 2000, "grads/device": 2000, "optimizer_states/nvme": 8000,
                   "master/nvme": 4000, "io_buffers/cpu": 5e6},
        "transient_peak": {"comm_buffers": 3e6, "working_params": 7e6}, "activation_bytes": 20e6,
        "spec": {"zero": {"dtype": "bf16", "offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "none"}}},
    }
    row = attribute(measurement)
    assert row["model_states"] == 4000  # the NVMe bytes are on disk, not in the process
    assert row["model_states_formula"] == model_state_bytes(num_params=1000, stage=3, dp_size=2)
    assert row["io_buffers"] == 5e6 and row["gathered_params"] == 7e6 and row["comm_buffers"] == 3e6
    assert sum(row[c] for c in COLUMNS) == pytest.approx(row["rss_peak"])
    text = render_markdown(report_frame([measurement, {**measurement, "framework": "peer", "notes": "x"}]))
    assert "| repro | 3 | nvme/none |" in text and "peer stage 3: x" in text


@needs("matplotlib")  # the report always draws <out>.png
def test_cli_help_and_a_small_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "--rows" in capsys.readouterr().out
    out = tmp_path / "report"
    assert main(["--world-size", "1", "--stages", "1", "3", "--hidden-size", "32", "--num-layers", "1",
                 "--vocab-size", "128", "--seq-len", "16", "--steps", "1", "--out", str(out)]) == 0
    rows = json.loads((tmp_path / "report.json").read_text())
    assert [r["stage"] for r in rows] == [1, 3] and all(r["rss_peak"] > 0 for r in rows)
    assert (tmp_path / "report.png").stat().st_size > 0 and "| repro | 1 |" in (tmp_path / "report.md").read_text()
