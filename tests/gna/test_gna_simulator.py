"""The tile simulator: against brute-force counting on the dense mask, and against the paper's numbers
(GNA Tables 2, 4, 5 and 6, Fig. 3; expected values are read from paper_claims.csv). End-to-end columns are Amdahl of
the unrounded op speedup, compared at the paper's printed two decimals; the cells where that is 0.01 off the paper
are named (the paper applied Amdahl to its op speedups printed at one decimal)."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from gna_cases import gna_claims, random_cases
from repro.gna import GNASpec, end_to_end_speedup, flopwise_speedup, gna_mask, simulate
from repro.gna.simulator import choose_tile_shapes, dynamic_kv_tiling_is_block_sparse, dynamic_tiling_block_sparse
from repro.gna.tiling import _gather_index, all_dim_tiles

# Problem shapes and tile shapes of the paper (§4; Fig. 3 caption; NATTEN docs for FLUX).
MODELS = {
    "flux1dev_4k": dict(grid=(256, 256), q_tile=(16, 16), kv_tile=(16, 8), steps=28),
    "hunyuanvideo": dict(grid=(30, 48, 80), q_tile=(4, 8, 8), kv_tile=(2, 8, 8), steps=50),
    "cosmos7b": dict(grid=(16, 44, 80), q_tile=None, kv_tile=None, steps=35),
}
ROW = re.compile(r"^t[234]_(?P<model>[a-z0-9_]+?)_w(?P<w>[\dx]+)_s(?P<s>[\dx]+)_sa(?P<sa>\d+)_(?P<kind>sim|flopwise)$")


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("x"))


def _share(claims: dict[str, str], model: str) -> float:
    """Self-attention share of end-to-end time (Table 1): % SA in DiT x % DiT in E2E, else the printed product."""
    try:
        return float(claims[f"t1_{model}_sa_in_dit"]) * float(claims[f"t1_{model}_dit_in_e2e"]) / 1e4
    except ValueError:
        return float(claims[f"t1_{model}_sa_in_e2e"]) / 100


def _table_rows(kind: str, models: tuple[str, ...]):
    claims = gna_claims()
    for claim_id, text in sorted(claims.items()):
        match = ROW.match(claim_id)
        if match and match["kind"] == kind and match["model"] in models:
            model = MODELS[match["model"]]
            spec = GNASpec(_shape(match["w"]), stride=_shape(match["s"]))
            fraction = (model["steps"] - int(match["sa"])) / model["steps"]
            yield claim_id, float(text), model, spec, _share(claims, match["model"]), fraction


def _tile_major(layouts) -> torch.Tensor:
    """Source token of every position of the tiled sequence (tiles row-major, then tokens row-major in a tile)."""
    source = _gather_index(layouts).view([layout.padded for layout in layouts])
    split = [size for layout in layouts for size in (layout.num_tiles, layout.tile)]
    ndim = len(layouts)
    return source.reshape(split).permute(*range(0, 2 * ndim, 2), *range(1, 2 * ndim, 2)).reshape(-1)


def _brute_force(grid, spec, q_tile, kv_tile):
    """Tile-pair classes counted on the dense mask in the kernels' token order: (full, partial, worst per q tile).
    Only real query rows count; padded keys never attend."""
    dims = all_dim_tiles(grid, spec, q_tile, kv_tile)
    tokens = math.prod(grid)
    q_source = _tile_major([d.q_layout for d in dims])  # source token per permuted position, `tokens` = padding
    kv_source = _tile_major([d.kv_layout for d in dims])
    mask = torch.zeros(tokens + 1, tokens + 1, dtype=torch.bool)
    mask[:tokens, :tokens] = gna_mask(grid, spec)
    permuted = mask[q_source][:, kv_source]
    tq, tk = math.prod(q_tile), math.prod(kv_tile)
    blocks = permuted.view(-1, tq, kv_source.numel() // tk, tk)
    real = (q_source < tokens).view(-1, tq)
    any_ = torch.stack([blocks[t][real[t]].any(dim=0).any(dim=-1) for t in range(blocks.shape[0])])
    all_ = torch.stack([blocks[t][real[t]].all(dim=0).all(dim=-1) for t in range(blocks.shape[0])])
    return int(all_.sum()), int((any_ & ~all_).sum()), int(any_.sum(dim=1).max())


@pytest.mark.parametrize("case", random_cases(45, seed=77), ids=str)
def test_tile_counts_match_brute_force(case):
    result = simulate(case.grid, case.spec, case.q_tile, case.kv_tile)
    full, partial, worst = _brute_force(case.grid, case.spec, case.q_tile, case.kv_tile)
    # Padded query rows repeat a real row's keys, so counting over real rows gives the same classes.
    assert (result.full_pairs, result.partial_pairs, result.worst_kv_tiles) == (full, partial, worst)
    mask = gna_mask(case.grid, case.spec)
    assert result.flopwise_speedup == pytest.approx(mask.numel() / int(mask.sum()))


def test_flux_simulator_column_exact():
    rows = list(_table_rows("sim", ("flux1dev_4k",)))
    assert len(rows) == 6
    for claim_id, paper, model, spec, share, fraction in rows:
        op = simulate(model["grid"], spec, model["q_tile"], model["kv_tile"]).worst_tile_speedup
        assert round(end_to_end_speedup(op, share, fraction), 2) == paper, claim_id


def _one_decimal_first(op: float, share: float, fraction: float = 1.0) -> float:
    """Amdahl of the op speedup rounded to the one decimal the paper prints op speedups at: how the paper's cells
    come out (shown in the claims' notes where a cell differs; never what the suite compares)."""
    return end_to_end_speedup(round(op, 1), share, fraction)


# The three HunyuanVideo simulator cells that exact Amdahl misses by 0.01: 900/630 = 1.43x (printed 1.4x) and
# 900/165 = 5.45x (printed 5.5x).
HUNYUAN_SIM_OFF = {"t4_hunyuanvideo_w30x40x40_s1x1x1_sa0_sim", "t4_hunyuanvideo_w30x40x40_s1x1x1_sa15_sim",
                   "t4_hunyuanvideo_w18x24x24_s1x1x8_sa0_sim"}


def test_hunyuan_simulator_column():
    """17 of 20 cells at the printed precision; the other 3 are 0.01 off, and Amdahl of the op speedup at one
    decimal gives the paper's value there (how the rounding convention was identified; the suite does not use it)."""
    rows = list(_table_rows("sim", ("hunyuanvideo",)))
    assert len(rows) == 20
    off = set()
    for claim_id, paper, model, spec, share, fraction in rows:
        op = simulate(model["grid"], spec, model["q_tile"], model["kv_tile"]).worst_tile_speedup
        ours = round(end_to_end_speedup(op, share, fraction), 2)
        if ours != paper:
            off.add(claim_id)
            assert abs(ours - paper) == pytest.approx(0.01), claim_id
        assert round(_one_decimal_first(op, share, fraction), 2) == paper, claim_id
    assert off == HUNYUAN_SIM_OFF


def test_flopwise_end_to_end_columns():
    """38 of 42 cells at two decimals; Cosmos' 16x32x48 cells at 0 initial steps give 1.49 (2.29x exactly) where the
    paper prints 1.50 (Amdahl of 2.3x). The claims table holds those four as "1.5", so the report compares them at
    one decimal: a loss of the printed precision in the table, not a rule of the suite."""
    rows = list(_table_rows("flopwise", ("flux1dev_4k", "hunyuanvideo", "cosmos7b")))
    assert len(rows) == 6 + 20 + 16
    off = set()
    for claim_id, paper, model, spec, share, fraction in rows:
        op = flopwise_speedup(model["grid"], spec)
        if round(end_to_end_speedup(op, share, fraction), 2) != paper:
            off.add(claim_id)
            assert round(end_to_end_speedup(op, share, fraction), 2) == 1.49 and paper == 1.5, claim_id
        assert round(_one_decimal_first(op, share, fraction), 2) == paper, claim_id
    assert off == {f"t3_cosmos7b_w16x32x48_s{s}_sa0_flopwise" for s in ("1x1x1", "1x8x1", "1x1x16", "1x8x16")}


@pytest.mark.parametrize("label, window, stride, exact", [
    ("na58", (30, 40, 40), (1, 1, 1), False), ("gna58", (30, 40, 40), (1, 32, 8), True),
    ("na91", (18, 24, 24), (1, 1, 1), True), ("gna91", (18, 24, 24), (16, 8, 8), True),
])
def test_table5_simulator_rows(label, window, stride, exact):
    """Table 5 (HunyuanVideo, GNA in all 50 steps). na58 restates Table 4's 30x40x40 cell (0.01 off, as there). Its
    two WSA rows (stride = window) are not reproduced: their printed values need op speedups near 2.0x and
    6.5-6.6x, while the worst query tile gives 2.4x and 6.7x."""
    claims = gna_claims()
    model = MODELS["hunyuanvideo"]
    op = simulate(model["grid"], GNASpec(window, stride=stride), model["q_tile"], model["kv_tile"]).worst_tile_speedup
    ours = end_to_end_speedup(op, _share(claims, "hunyuanvideo"))
    assert (round(ours, 2) == float(claims[f"t5_{label}_e2e_sim"])) is exact


@pytest.mark.parametrize("stride", [(1, 1), (16, 1), (16, 16)])
def test_table6_simulator_rows_exact(stride):
    claims = gna_claims()
    model = MODELS["flux1dev_4k"]
    op = simulate(model["grid"], GNASpec((80, 80), stride=stride), model["q_tile"], model["kv_tile"])
    ours = end_to_end_speedup(op.worst_tile_speedup, _share(claims, "flux1dev_4k"), (28 - 9) / 28)
    assert round(ours, 2) == float(claims[f"t6_s{stride[0]}x{stride[1]}_e2e_sim"])


def test_figure3_limits():
    claims = gna_claims()
    model = MODELS["hunyuanvideo"]
    na = simulate(model["grid"], GNASpec((18, 24, 24)), model["q_tile"], model["kv_tile"])
    gna = simulate(model["grid"], GNASpec((18, 24, 24), stride=(16, 8, 8)), model["q_tile"], model["kv_tile"])
    assert round(na.worst_tile_speedup, 1) == float(claims["fig3_na_limit"])
    assert round(gna.worst_tile_speedup, 1) == float(claims["fig3_blocksparse"])
    assert gna.block_sparse and not na.block_sparse
    assert gna.worst_tile_speedup == pytest.approx(gna.flopwise_speedup)  # block-sparse: FLOP-wise bound reached


def _dynamic_brute_force(grid, spec, q_tile, kv_tile) -> bool:
    """Dynamic KV tiling on the dense mask: block-sparse iff, for every query tile, its real rows attend one key
    set and that set holds a multiple of the KV tile's extent of distinct coordinates in every dimension."""
    dims = all_dim_tiles(grid, spec, q_tile, kv_tile)
    tokens = math.prod(grid)
    q_source = _tile_major([d.q_layout for d in dims])
    mask = gna_mask(grid, spec)
    for rows in q_source.view(-1, math.prod(q_tile)):
        keys = mask[rows[rows < tokens]]
        if not bool((keys == keys[0]).all()):
            return False
        coords = torch.stack(torch.unravel_index(keys[0].nonzero().squeeze(1), grid), dim=1)
        if any(coords[:, d].unique().numel() % kv_tile[d] for d in range(len(grid))):
            return False
    return True


@pytest.mark.parametrize("case", random_cases(30, seed=91), ids=str)
def test_dynamic_kv_tiling_matches_brute_force(case):
    for kv_tile in (case.kv_tile, tuple(max(1, w // 2) for w in case.spec.window), case.spec.window):
        assert dynamic_kv_tiling_is_block_sparse(case.grid, case.spec, case.q_tile, kv_tile) == \
            _dynamic_brute_force(case.grid, case.spec, case.q_tile, kv_tile), kv_tile


def test_paper_condition_implies_dynamic_but_not_static_block_sparsity():
    """§3.2: T_KV | window and T_Q | stride make GNA perfectly block-sparse under dynamic KV tiling, at every stride
    of a small sweep; static tiling (fixed KV boxes) follows it only where the windows happen to align with them."""
    grid, window, q_tile, kv_tile = (12, 20), (6, 8), (3, 4), (2, 4)
    meets, static = 0, 0
    for stride in itertools.product(range(1, 7), range(1, 9)):
        spec = GNASpec(window, stride=stride)
        if dynamic_tiling_block_sparse(spec, q_tile, kv_tile):
            meets += 1
            assert dynamic_kv_tiling_is_block_sparse(grid, spec, q_tile, kv_tile), stride
            static += simulate(grid, spec, q_tile, kv_tile).block_sparse
    assert meets == 4 and 0 < static < meets
    # the condition is sufficient, not necessary: a window spanning a whole dimension needs no divisibility there
    assert dynamic_kv_tiling_is_block_sparse((6, 8), GNASpec((6, 8), stride=(1, 8)), (4, 8), (6, 8))
    assert not dynamic_tiling_block_sparse(GNASpec((6, 8), stride=(1, 8)), (4, 8), (6, 8))


def test_end_to_end_speedup_is_amdahl():
    assert end_to_end_speedup(1.0, 0.6) == pytest.approx(1.0)
    assert end_to_end_speedup(1e12, 0.5) == pytest.approx(2.0)
    assert end_to_end_speedup(2.0, 0.5, 0.5) == pytest.approx(1 / (0.75 + 0.125))
    with pytest.raises(ValueError, match="attention_share=1.5"):
        end_to_end_speedup(2.0, 1.5)


def test_tile_choice_finds_block_sparse_tiles_for_strided_windows():
    for grid, spec in [((64, 64), GNASpec((24, 48), stride=(8, 16))), ((8192,), GNASpec(512, stride=256))]:
        q_tile, kv_tile = choose_tile_shapes(grid, spec)
        result = simulate(grid, spec, q_tile, kv_tile)
        assert result.block_sparse and result.work_speedup == pytest.approx(result.flopwise_speedup)
