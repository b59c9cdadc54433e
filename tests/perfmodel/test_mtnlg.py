"""MT-NLG 530B: throughput at 280/350/420 nodes (fitted at 280 only), parameter count, memory per GPU."""

import pytest

from repro.perfmodel.mtnlg import (
    BYTES_PER_PARAM, GLOBAL_BATCH, MTNLG_530B, PP_SIZE, SELENE_NODES, TP_SIZE, calibrate_a100, layout_for_nodes,
    memory_per_gpu_530b, predict_tflops_per_gpu, tokens_per_parameter, tokens_per_step, total_gpus,
)

from perfmodel_claims import paper

N = "mt_nlg_2022"


@pytest.fixture(scope="module")
def eff():
    return calibrate_a100(num_nodes=280, iteration_time_s=paper(N, "iter_time_280n"))


def test_layout_matches_the_paper():
    assert (TP_SIZE, PP_SIZE) == (paper(N, "tp"), paper(N, "pp"))
    assert TP_SIZE * PP_SIZE == paper(N, "gpus_per_replica")
    for nodes in (280, 350, 420):
        assert layout_for_nodes(nodes).dp_size == paper(N, f"dp_{nodes}n")
    assert (MTNLG_530B.num_layers, MTNLG_530B.hidden_size, MTNLG_530B.num_heads, MTNLG_530B.seq_length) == (
        paper(N, "layers"), paper(N, "hidden"), paper(N, "heads"), paper(N, "seq_len"))


@pytest.mark.parametrize("nodes", [280, 350, 420])
def test_tflops_per_gpu_within_5_percent(eff, nodes):
    assert predict_tflops_per_gpu(nodes, eff=eff) == pytest.approx(paper(N, f"tflops_{nodes}n"), rel=0.05)


def test_throughput_falls_with_more_nodes_as_the_bubble_grows(eff):
    values = [predict_tflops_per_gpu(n, eff=eff) for n in (280, 350, 420)]
    assert values[0] > values[1] > values[2]


def test_memory_per_gpu_of_the_8x35_layout():
    memory = memory_per_gpu_530b()
    per_gpu_params = paper(N, "params_repro") * 1e9 / paper(N, "gpus_per_replica")
    assert memory.model_states == pytest.approx(paper(N, "bytes_per_param") * per_gpu_params, rel=1e-3)
    assert memory.model_states * paper(N, "gpus_per_replica") / 1e12 == pytest.approx(
        paper(N, "model_state_tb"), rel=0.01)
    assert memory.total < 80e9  # fits an A100 80GB


def test_derived_quantities_match_the_paper():
    assert BYTES_PER_PARAM == paper(N, "bytes_per_param")
    assert GLOBAL_BATCH == paper(N, "global_batch") and SELENE_NODES == paper(N, "nodes")
    assert total_gpus(SELENE_NODES) == paper(N, "gpus_total")
    assert layout_for_nodes(SELENE_NODES).dp_size == paper(N, "dp_full")
    assert tokens_per_step() / 1e6 == pytest.approx(paper(N, "tokens_per_step"), abs=0.005)
    assert tokens_per_parameter(paper(N, "train_tokens") * 1e9) == pytest.approx(paper(N, "tokens_per_param"),
                                                                                 abs=0.005)


def test_a100_layout_rejects_node_counts_that_do_not_tile():
    with pytest.raises(ValueError, match="multiple"):
        layout_for_nodes(100)
