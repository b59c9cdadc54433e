"""Re-sharding a ZeRO optimizer state to another data-parallel degree: the pure function round-trips exactly, and
a run saved at dp 2 and continued at dp 1 or dp 4 (same global batch) follows a straight run at the new degree
within 1e-6 relative, for stages 0-3."""

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.models import GPTModel
from repro.zero import ZeroConfig, build_zero_optimizer
from repro.zero.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from repro.zero.partition import flat_layout
from repro.zero.reshard import reshard_states
from zero_cases import LR, MAX_NORM, TINY, WEIGHT_DECAY, max_rel_diff, train_steps

# -- the pure function --------------------------------------------------------------------------------------------
NUMELS = [[5, 3, 4], [7], [2, 9]]  # three buckets; 12, 7 and 11 elements pad differently for 2, 3 and 4 shards


def _full_buckets(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [{name: torch.randn(sum(numels), generator=gen) for name in ("master", "exp_avg", "exp_avg_sq")}
            for numels in NUMELS]


def _states(full: list[dict[str, torch.Tensor]], world: int, stage: int) -> list[dict]:
    """What DataParallelOptimizer.state_dict() returns on each of ``world`` dp ranks for these full buckets."""
    layout_world = 1 if stage == 0 else world
    states = []
    for rank in range(world):
        buckets = []
        for index, (numels, tensors) in enumerate(zip(NUMELS, full)):
            layout = flat_layout(numels, layout_world)
            lo, hi = layout.shard_range(0 if stage == 0 else rank)

            def shard(tensor):
                padded = torch.zeros(layout.padded_numel)
                padded[:tensor.numel()] = tensor
                return padded[lo:hi].clone()

            buckets.append({
                "key": f"b{index}", "numels": list(numels), "names": [f"p{index}.{i}" for i in range(len(numels))],
                "group": 0, "shapes": [[n] for n in numels], "layout_world": layout_world,
                "layout_rank": 0 if stage == 0 else rank,
                "state": {"master": shard(tensors["master"]),
                          "tensors": {k: shard(tensors[k]) for k in ("exp_avg", "exp_avg_sq")},
                          "scalars": {"step": torch.tensor(7.0)}},
            })
        states.append({"format": "repro-zero/1", "stage": stage, "dp_rank": rank, "dp_size": world,
                       "buckets": buckets, "param_groups": [{"lr": 0.1}], "precision": {"scale": 1.0}})
    return states


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if key == "buckets":
            for x, y in zip(a[key], b[key], strict=True):
                assert {k: v for k, v in x.items() if k != "state"} == {k: v for k, v in y.items() if k != "state"}
                assert torch.equal(x["state"]["master"], y["state"]["master"])
                for name in x["state"]["tensors"]:
                    assert torch.equal(x["state"]["tensors"][name], y["state"]["tensors"][name])
                assert x["state"]["scalars"] == y["state"]["scalars"]
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_reshard_round_trip_2_3_2_is_exact(stage):
    full = _full_buckets()
    two = _states(full, 2, stage)
    three = [reshard_states(two, new_dp_size=3, new_dp_rank=rank, stage=stage) for rank in range(3)]
    for got, expected in zip(three, _states(full, 3, stage), strict=True):
        _same(got, expected)  # 2 -> 3 equals what a 3-rank optimizer holds
    back = [reshard_states(list(reversed(three)), new_dp_size=2, new_dp_rank=rank, stage=stage) for rank in range(2)]
    for got, original in zip(back, two, strict=True):
        _same(got, original)


def test_reshard_stage0_keeps_whole_buckets_and_can_move_to_a_sharded_stage():
    full = _full_buckets(1)
    stage0 = _states(full, 2, 0)  # two identical unsharded copies
    for new_size in (1, 4):
        for rank in range(new_size):
            _same(reshard_states(stage0, new_dp_size=new_size, new_dp_rank=rank, stage=0),
                  _states(full, new_size, 0)[rank])
    sharded = _states(full, 3, 1)
    for rank in range(3):  # stages 0-2 share one bucket layout
        _same(reshard_states(stage0, new_dp_size=3, new_dp_rank=rank, stage=1), sharded[rank])
    _same(reshard_states(sharded, new_dp_size=1, new_dp_rank=0, stage=0), _states(full, 1, 0)[0])


def test_reshard_refuses_incomplete_or_mismatched_states():
    two = _states(_full_buckets(), 2, 1)
    with pytest.raises(ValueError, match="one state per dp rank"):
        reshard_states(two[:1], new_dp_size=1, new_dp_rank=0, stage=1)
    with pytest.raises(ValueError, match="new_dp_rank=2"):
        reshard_states(two, new_dp_size=2, new_dp_rank=2, stage=1)
    with pytest.raises(ValueError, match="stage 3 cuts its buckets per module"):
        reshard_states(two, new_dp_size=2, new_dp_rank=0, stage=3)


# -- training across a change of dp degree ------------------------------------------------------------------------
STEPS, SAVE_AT, STAGES = 6, 3, (0, 1, 2, 3)


def _config(stage: int) -> ZeroConfig:
    return ZeroConfig(stage=stage, max_grad_norm=MAX_NORM, bucket_numel=5000)  # several buckets per stage


def _train(groups, stage: int, directory: str, *, first: int, last: int, save: bool = False,
           resume: bool = False) -> list[float]:
    """Steps [first, last) on the global batch of zero_cases (BATCH rows split over the dp ranks)."""
    torch.manual_seed(0)
    model = GPTModel(TINY)
    optimizer = build_zero_optimizer(model, _config(stage), dp_group=groups.dp, lr=LR, weight_decay=WEIGHT_DECAY)
    if resume:
        assert load_checkpoint(directory, optimizer, allow_reshard=True) == {"step": first}
    losses = train_steps(model, optimizer, groups, range(first, last))
    if save:
        save_checkpoint(directory, optimizer, extra={"step": last})
    optimizer.close()
    return losses


def _first_half_at_dp2(rank, world_size, root):
    groups = init_parallel()
    for stage in STAGES:
        _train(groups, stage, f"{root}/stage{stage}", first=0, last=SAVE_AT, save=True)


def _continue(rank, world_size, root):
    groups = init_parallel()
    out = {}
    for stage in STAGES:
        directory = f"{root}/stage{stage}"
        torch.manual_seed(0)
        optimizer = build_zero_optimizer(GPTModel(TINY), _config(stage), dp_group=groups.dp, lr=LR)
        with pytest.raises(CheckpointError, match="written by 2 ranks .* pass allow_reshard=True"):
            load_checkpoint(directory, optimizer)
        optimizer.close()
        straight = _train(groups, stage, directory, first=0, last=STEPS)
        resumed = _train(groups, stage, directory, first=SAVE_AT, last=STEPS, resume=True)
        out[stage] = (straight[SAVE_AT:], resumed)
    return out


@pytest.fixture(scope="module")
def saved_at_dp2(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    spawn(_first_half_at_dp2, 2, str(root), timeout_s=300)
    return root


@pytest.mark.parametrize("new_dp", [1, 4])
def test_resume_at_another_dp_size_matches_a_straight_run(saved_at_dp2, new_dp):
    results = spawn(_continue, new_dp, str(saved_at_dp2), timeout_s=300)[0]
    for stage, (straight, resumed) in results.items():
        assert len(resumed) == STEPS - SAVE_AT
        print(f"dp2 -> dp{new_dp} stage {stage}: max relative loss difference {max_rel_diff(resumed, straight):.2e}")
        assert max_rel_diff(resumed, straight) <= 1e-6, (stage, resumed, straight)
