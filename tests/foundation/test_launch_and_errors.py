"""Launch-variable parsing, the rank grid, and the clear errors the foundation raises for bad input."""

import pytest
import torch

from repro.dist import GridCoord, RankGrid, init_parallel, read_launch_env, resolve_grid, spawn
from repro.dist.launch import first_slurm_host, slurm_port
from repro.models import GPTConfig, GPTModel
from repro.tensor_parallel import seed_everything


def test_torchrun_variables():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "1234"}
    launch = read_launch_env(env)
    assert (launch.rank, launch.world_size, launch.local_rank, launch.master_addr, launch.master_port) == (
        3, 4, 1, "n1", 1234)
    assert launch.launcher == "torchrun"


def test_srun_variables():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_JOB_NODELIST": "gpu[07-10,12],cpu1", "SLURM_JOB_ID": "123456"}
    launch = read_launch_env(env)
    assert (launch.rank, launch.world_size, launch.local_rank) == (5, 8, 1)
    assert launch.master_addr == "gpu07"
    assert launch.master_port == slurm_port("123456") == 20000 + 123456 % 20000
    assert launch.launcher == "srun"


def test_no_launcher_is_single_process():
    assert read_launch_env({}).world_size == 1


@pytest.mark.parametrize("nodelist,first", [("a1", "a1"), ("a1,a2", "a1"), ("node[3-5]", "node3"),
                                            ("x[001,004]", "x001")])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


@pytest.mark.parametrize("env,message", [
    ({"RANK": "0"}, "WORLD_SIZE is missing"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR or MASTER_PORT is missing"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "rank 2 is outside"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "SLURM_LOCALID is missing"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": ""},
     "SLURM_JOB_NODELIST is empty"),
])
def test_bad_launch_variables(env, message):
    with pytest.raises(ValueError, match=message):
        read_launch_env(env)


def test_rank_grid_tp_innermost():
    grid = RankGrid(tp=2, dp=2, pp=2)
    assert grid.tp_groups()[0] == [0, 1]
    assert grid.dp_groups()[0] == [0, 2]
    assert grid.pp_groups()[0] == [0, 4]
    assert grid.coord(7) == GridCoord(tp_rank=1, dp_rank=1, pp_rank=1)
    assert all(grid.rank(grid.coord(r)) == r for r in range(8))
    assert grid.embedding_groups()[0] == [0, 4]


def _embedding_ranks_rank(rank, ws):
    groups = init_parallel(pp=4)
    return groups.embedding.ranks


def test_middle_pipeline_stages_have_an_embedding_group_of_one():
    assert spawn(_embedding_ranks_rank, 4) == [(0, 3), (1,), (2,), (0, 3)]


@pytest.mark.parametrize("world,kwargs,message", [
    (4, dict(tp=3), "not divisible by tp \\* pp"),
    (8, dict(tp=2, pp=2, dp=3), "world size 8 != tp \\* pp \\* dp = 2 \\* 2 \\* 3 = 12"),
    (4, dict(tp=0), "tp=0 must be a positive integer"),
])
def test_world_size_must_be_tp_pp_dp(world, kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve_grid(world, **kwargs)


def _wrong_world_size_rank(rank, ws):
    with pytest.raises(ValueError, match="world size 2 != tp \\* pp \\* dp"):
        init_parallel(tp=2, dp=2)
    return True


def test_init_parallel_rejects_wrong_world_size():
    assert all(spawn(_wrong_world_size_rank, 2))


@pytest.mark.parametrize("kwargs,tp,message", [
    (dict(hidden_size=32, num_attention_heads=4), 3, "num_attention_heads=4 is not divisible by tp=3"),
    (dict(hidden_size=30, num_attention_heads=6), 4, "num_attention_heads=6 is not divisible by tp=4"),
    (dict(hidden_size=36, num_attention_heads=2, ffn_hidden_size=36), 2, None),
    (dict(hidden_size=32, num_attention_heads=2, ffn_hidden_size=33), 2, "ffn_hidden_size=33 is not divisible by tp=2"),
])
def test_divisibility_by_tp(kwargs, tp, message):
    config = GPTConfig(vocab_size=64, num_layers=1, max_position_embeddings=8, **kwargs)
    if message is None:
        config.check_tensor_parallel(tp)
    else:
        with pytest.raises(ValueError, match=message):
            config.check_tensor_parallel(tp)


def test_hidden_not_divisible_by_heads():
    with pytest.raises(ValueError, match="hidden_size=30 is not divisible by num_attention_heads=4"):
        GPTConfig(vocab_size=64, hidden_size=30, num_layers=1, num_attention_heads=4, max_position_embeddings=8)


def test_linear_features_not_divisible_by_tp():
    from repro.tensor_parallel.layers import divide

    with pytest.raises(ValueError, match="output features=10 is not divisible by the tensor-parallel size 4"):
        divide(10, 4, "output features")


def test_model_rejects_bad_tokens_and_lengths():
    model = GPTModel(GPTConfig(vocab_size=64, hidden_size=16, num_layers=1, num_attention_heads=2,
                               max_position_embeddings=8))
    with pytest.raises(ValueError, match="token ids must lie in \\[0, vocab_size=64\\)"):
        model(torch.tensor([[1, 64]]))
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_position_embeddings=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def _dropout_masks_rank(rank, ws):
    tracker = seed_everything(1234, tp_rank=rank)
    outside = torch.nn.functional.dropout(torch.ones(1000), 0.5)
    with tracker.fork():
        inside = torch.nn.functional.dropout(torch.ones(1000), 0.5)
    outside_after = torch.nn.functional.dropout(torch.ones(1000), 0.5)
    return outside, inside, outside_after


def test_rng_tracker_differs_inside_agrees_outside():
    """Megatron sec. 3: dropout masks differ across tp ranks inside parallel regions, agree outside them."""
    (o0, i0, a0), (o1, i1, a1) = spawn(_dropout_masks_rank, 2)
    assert torch.equal(o0, o1) and torch.equal(a0, a1)
    assert not torch.equal(i0, i1)
    assert not torch.equal(o0, a0)  # the replicated stream advanced
