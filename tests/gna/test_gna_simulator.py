"""The tile simulator: against brute-force counting on the dense mask, and against the paper's numbers
(GNA Tables 2, 4, 5 and 6, Fig. 3; expected values are read from paper_claims.csv). End-to-end columns are compared
through ``paper_end_to_end_speedup`` (Amdahl of the op speedup at the paper's one printed decimal), at the printed
precision."""

from __future__ import annotations

import math
import re

import pytest
import torch

from gna_cases import gna_claims, random_cases
from repro.gna import GNASpec, end_to_end_speedup, flopwise_speedup, gna_mask, simulate
from repro.gna.simulator import choose_tile_shapes, dynamic_tiling_block_sparse, paper_end_to_end_speedup
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
        assert round(paper_end_to_end_speedup(op, share, fraction), 2) == paper, claim_id


def test_hunyuan_simulator_column_exact():
    """All 20 cells at the printed precision. Exact Amdahl of the unrounded op speedup misses 3 of them by 0.01
    (30x40x40 stride 1 at 0 and 15 SA steps: 900/630 = 1.43x, printed 1.4x; 18x24x24 stride 1x1x8 at 0 steps:
    900/165 = 5.45x, printed 5.5x), which is how the rounding convention was identified."""
    rows = list(_table_rows("sim", ("hunyuanvideo",)))
    assert len(rows) == 20
    exact_amdahl_matches = 0
    for claim_id, paper, model, spec, share, fraction in rows:
        op = simulate(model["grid"], spec, model["q_tile"], model["kv_tile"]).worst_tile_speedup
        assert round(paper_end_to_end_speedup(op, share, fraction), 2) == paper, claim_id
        exact_amdahl_matches += round(end_to_end_speedup(op, share, fraction), 2) == paper
    assert exact_amdahl_matches == 17


def test_flopwise_end_to_end_columns_exact():
    rows = list(_table_rows("flopwise", ("flux1dev_4k", "hunyuanvideo", "cosmos7b")))
    assert len(rows) == 6 + 20 + 16
    for claim_id, paper, model, spec, share, fraction in rows:
        ours = paper_end_to_end_speedup(flopwise_speedup(model["grid"], spec), share, fraction)
        assert round(ours, 2) == paper, claim_id


@pytest.mark.parametrize("label, window, stride", [
    ("na58", (30, 40, 40), (1, 1, 1)), ("gna58", (30, 40, 40), (1, 32, 8)),
    ("na91", (18, 24, 24), (1, 1, 1)), ("gna91", (18, 24, 24), (16, 8, 8)),
])
def test_table5_simulator_rows_exact(label, window, stride):
    """Table 5 (HunyuanVideo, GNA in all 50 steps). Its two WSA rows (stride = window) are not reproduced: their
    printed values need op speedups near 2.0x and 6.5-6.6x, while the worst query tile gives 2.4x and 6.7x."""
    claims = gna_claims()
    model = MODELS["hunyuanvideo"]
    op = simulate(model["grid"], GNASpec(window, stride=stride), model["q_tile"], model["kv_tile"]).worst_tile_speedup
    ours = paper_end_to_end_speedup(op, _share(claims, "hunyuanvideo"))
    assert round(ours, 2) == float(claims[f"t5_{label}_e2e_sim"])


@pytest.mark.parametrize("stride", [(1, 1), (16, 1), (16, 16)])
def test_table6_simulator_rows_exact(stride):
    claims = gna_claims()
    model = MODELS["flux1dev_4k"]
    op = simulate(model["grid"], GNASpec((80, 80), stride=stride), model["q_tile"], model["kv_tile"])
    ours = paper_end_to_end_speedup(op.worst_tile_speedup, _share(claims, "flux1dev_4k"), (28 - 9) / 28)
    assert round(ours, 2) == float(claims[f"t6_s{stride[0]}x{stride[1]}_e2e_sim"])


def test_paper_end_to_end_speedup_rounds_the_op_speedup_first():
    assert paper_end_to_end_speedup(900 / 630, 0.6) == pytest.approx(end_to_end_speedup(1.4, 0.6))
    assert paper_end_to_end_speedup(900 / 165, 0.6, 0.5) == pytest.approx(end_to_end_speedup(5.5, 0.6, 0.5))
    assert paper_end_to_end_speedup(1.4286, 0.6, op_decimals=2) == pytest.approx(end_to_end_speedup(1.43, 0.6))
    with pytest.raises(ValueError, match="op_decimals=-1"):
        paper_end_to_end_speedup(2.0, 0.5, op_decimals=-1)
    with pytest.raises(ValueError, match="rounds to 0.0"):
        paper_end_to_end_speedup(0.04, 0.5)


def test_figure3_limits():
    claims = gna_claims()
    model = MODELS["hunyuanvideo"]
    na = simulate(model["grid"], GNASpec((18, 24, 24)), model["q_tile"], model["kv_tile"])
    gna = simulate(model["grid"], GNASpec((18, 24, 24), stride=(16, 8, 8)), model["q_tile"], model["kv_tile"])
    assert round(na.worst_tile_speedup, 1) == float(claims["fig3_na_limit"])
    assert round(gna.worst_tile_speedup, 1) == float(claims["fig3_blocksparse"])
    assert gna.block_sparse and not na.block_sparse
    assert gna.worst_tile_speedup == pytest.approx(gna.flopwise_speedup)  # block-sparse: FLOP-wise bound reached


def test_paper_condition_implies_block_sparse_on_table_configs():
    for kind in ("sim",):
        for claim_id, _, model, spec, _, _ in _table_rows(kind, ("flux1dev_4k", "hunyuanvideo")):
            result = simulate(model["grid"], spec, model["q_tile"], model["kv_tile"])
            if dynamic_tiling_block_sparse(spec, model["q_tile"], model["kv_tile"]):
                assert result.block_sparse, claim_id


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
