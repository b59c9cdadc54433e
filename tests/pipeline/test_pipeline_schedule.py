"""Pure pipeline arithmetic: layer partition, the 1F1B order, the simulated bubble, and bad input."""

import pytest

from repro.dist.groups import resolve_grid
from repro.pipeline.partition import check_micro_batches, layers_per_stage, stage_layers
from repro.pipeline.schedule import BACKWARD, FORWARD, bubble_fraction, max_in_flight, one_f_one_b
from repro.pipeline.timeline import idle_fractions, render, simulate_1f1b


def test_stage_layers_split_evenly():
    assert [list(stage_layers(8, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layers_per_stage(105, 35) == 3  # MT-NLG 530B: 105 layers over 35 stages


def test_pp_not_dividing_layers_is_refused():
    with pytest.raises(ValueError, match=r"num_layers=6 is not divisible by the pipeline-parallel size pp=4"):
        layers_per_stage(6, 4)
    with pytest.raises(ValueError, match="pp_rank=2 is outside"):
        stage_layers(4, 2, 2)


def test_fewer_micro_batches_than_stages_is_refused():
    with pytest.raises(ValueError, match=r"num_micro_batches=3 is fewer than the pipeline stages pp=4"):
        check_micro_batches(3, 4)
    with pytest.raises(ValueError, match="num_micro_batches=3 is fewer"):
        one_f_one_b(0, 4, 3)
    with pytest.raises(ValueError, match="must be a positive integer"):
        one_f_one_b(0, 2, 0)


def test_world_size_must_be_tp_pp_dp():
    with pytest.raises(ValueError, match=r"world size 6 != tp \* pp \* dp = 2 \* 2 \* 2 = 8"):
        resolve_grid(6, tp=2, pp=2, dp=2)
    with pytest.raises(ValueError, match="world size 6 is not divisible by tp \\* pp = 2 \\* 2 = 4"):
        resolve_grid(6, tp=2, pp=2)


def test_one_f_one_b_order():
    orders = {r: " ".join(map(str, one_f_one_b(r, 4, 6))) for r in range(4)}
    assert orders[0] == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    assert orders[2] == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5"
    assert orders[3] == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"


@pytest.mark.parametrize("pp_size,m", [(1, 3), (2, 2), (2, 8), (4, 4), (4, 9), (8, 16)])
def test_every_micro_batch_once_and_bounded_memory(pp_size, m):
    for r in range(pp_size):
        actions = one_f_one_b(r, pp_size, m)
        assert [a.micro_batch for a in actions if a.kind == FORWARD] == list(range(m))
        assert [a.micro_batch for a in actions if a.kind == BACKWARD] == list(range(m))
        # 1F1B keeps at most p - r micro-batches alive (GPipe would keep m)
        assert max_in_flight(actions) == min(pp_size - r, m)


@pytest.mark.parametrize("pp_size,m", [(2, 2), (2, 4), (3, 5), (4, 4), (4, 8), (8, 24)])
@pytest.mark.parametrize("forward_time,backward_time", [(1.0, 1.0), (1.0, 2.0)])
def test_simulated_idle_fraction_is_the_bubble(pp_size, m, forward_time, backward_time):
    events = simulate_1f1b(pp_size, m, forward_time=forward_time, backward_time=backward_time)
    expected = bubble_fraction(pp_size, m)
    assert idle_fractions(events, pp_size) == pytest.approx([expected] * pp_size, abs=1e-12)
    span = max(e.end for e in events) - min(e.start for e in events)
    assert span == pytest.approx((m + pp_size - 1) * (forward_time + backward_time))


def test_render_shows_the_warmup_and_cooldown():
    chart = render(simulate_1f1b(2, 3), 2, 1.0)
    assert chart.splitlines() == ["stage 0: FF..BBFBB.BB", "stage 1: .FBBFBBFBB.."]
