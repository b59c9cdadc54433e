"""The claims of ``gna_simulator`` (GNA sec. 3.2, 4-5, Tables 2-6): its rows, each carrying the evidence class it was
computed with (:func:`repro.paper.evidence_from` in :mod:`repro.experiments.gna_simulator`), against the paper's
numbers; claims that state one quantity are counted once. Kept apart from the experiment's points and rows so that
each file holds one concept; the experiment passes in what the checks need from its declarations."""

from __future__ import annotations

import math

from repro.verdicts import check_condition, check_value, not_run, row_evidence
from repro.vocabulary import ClaimCheck
from repro.paper import evidence_of_simulation

PAPER = "gna_2025"


def _paper_condition_check(rows) -> ClaimCheck:
    """§3.2: T_KV | window and T_Q | stride make a configuration perfectly block-sparse; with static tiling the
    condition is sufficient (windows spanning a whole dimension are block-sparse without it). Checked against the
    simulator's tile counts: simulated."""
    condition = rows[rows["metric"] == "paper_block_sparse_condition"].reset_index(drop=True)
    found = rows[rows["metric"] == "block_sparse"].reset_index(drop=True)
    if len(condition) == 0:
        return not_run(PAPER, "block_sparse_condition", evidence="simulated")
    implied = [(not c) or bool(b) for c, b in zip(condition["value"], found["value"])]
    holds = int(sum(condition["value"]))
    return check_condition(PAPER, "block_sparse_condition", f"{sum(implied)}/{len(implied)} configs consistent",
                           holds=all(implied), tolerance="condition => no partial tile", evidence="simulated",
                           note=f"the condition holds for {holds} table configs, all simulated without partial tiles"
                           if all(implied) else "a configuration meeting the condition has partial tiles")


def _decimals(claim_id: str) -> int:
    """How many decimals the paper prints for a claim (from the CSV's value text)."""
    from repro.paper import paper_text

    text = paper_text(PAPER, claim_id)
    return len(text.split(".")[1]) if "." in text else 0


def _origins() -> dict[str, str]:
    """claim id -> where the claims table has it from: ``verbatim`` (printed in the paper) or ``derived``."""
    from repro.paper import load_claims

    claims = load_claims()
    mine = claims[claims["paper"] == PAPER]
    return dict(zip(mine["claim_id"], mine["verbatim_or_derived"]))


def _cell(row, name: str) -> str:
    value = row.get(name)
    if value is None or isinstance(value, float) and math.isnan(value):
        return ""
    return str(int(value)) if isinstance(value, (int, float)) else str(value)


def _quantity(row) -> tuple[str, ...]:
    """The quantity a row's value is: its metric and configuration (an op-level quantity does not depend on the
    diffusion steps, which only Amdahl uses). Claims of one quantity are counted once (:func:`_counted_once`)."""
    names = ("model", "window", "stride") + (() if row["metric"].startswith("op_") else ("sa_steps",))
    return (row["metric"],) + tuple(_cell(row, name) for name in names)


def _flop_ratios(rows) -> dict[tuple, float]:
    """The FLOP-wise speedups of the rows: op-level by (model, window), end to end by (model, window, stride, sa)."""
    out: dict[tuple, float] = {}
    for _, row in rows[rows["metric"].isin(["op_flopwise_speedup", "e2e_flopwise_speedup"])].iterrows():
        if row["metric"] == "op_flopwise_speedup":
            out[("op", _cell(row, "model"), _cell(row, "window"))] = float(row["value"])
        else:
            out[("e2e",) + _quantity(row)[1:]] = float(row["value"])
    return out


def _as_flop_ratio(row, flop: dict[tuple, float], claim_id: str) -> tuple[tuple, str] | None:
    """(quantity, evidence) of a simulated speedup that equals the FLOP-wise ratio of its setting (perfectly
    block-sparse tiles) where the paper's value for ``claim_id`` is that ratio too: the simulation then adds nothing
    to the paper's FLOP arithmetic, so the row is the FLOP-wise quantity and its evidence consistency
    (:func:`repro.paper.evidence_of_simulation`). None otherwise: where the paper's simulation found partial tiles
    and this one none (Table 5's 30x40x40 window at stride 30x40x40: 1.44 against the FLOP-wise 1.55), the
    disagreement is a finding of the simulator and stays visible."""
    from repro.paper import paper_value

    if float(paper_value(PAPER, claim_id)) != round(flop.get(_flop_key(row), math.nan), _decimals(claim_id)):
        return None
    if row["metric"] == "op_sim_speedup":
        quantity = ("op_flopwise_speedup", _cell(row, "model"), _cell(row, "window"), "")
    else:
        quantity = ("e2e_flopwise_speedup",) + _quantity(row)[1:]
    evidence = evidence_of_simulation(float(row["value"]), flop.get(_flop_key(row)))
    return (quantity, evidence) if evidence == "consistency" else None


def _flop_key(row) -> tuple:
    """The key of :func:`_flop_ratios` for a simulated row's setting (None for another metric)."""
    if row["metric"] == "op_sim_speedup":
        return ("op", _cell(row, "model"), _cell(row, "window"))
    if row["metric"] == "e2e_sim_speedup":
        return ("e2e",) + _quantity(row)[1:]
    return None


def _specs(row, known, flop: dict[tuple, float]) -> list[tuple[tuple, dict]]:
    """(quantity, check_value keywords) of the claims a row with a claim id checks."""
    claim_id, value, evidence, quantity = row["claim_id"], float(row["value"]), row_evidence(row, "gna_simulator"), _quantity(row)
    as_flop = _as_flop_ratio(row, flop, claim_id) if _flop_key(row) is not None else None
    if as_flop is not None:
        quantity, evidence = as_flop

    def spec(claim, checked, **kw) -> tuple[tuple, dict]:
        return quantity, dict(claim_id=claim, value=checked, evidence=evidence, **kw)

    if row["metric"] == "e2e_flopwise_speedup":
        note = (f"Amdahl (Table 1 share) of the op speedup at the paper's 1 decimal; unrounded {value:.4f}, "
                f"exact Amdahl {float(row['exact_amdahl']):.4f}")
        specs = [spec(claim_id, round(value, _decimals(claim_id)), note=note)]
        if f"{claim_id}_repro" in known:  # the claims table's re-derivation: exact Amdahl
            specs.append(spec(f"{claim_id}_repro", float(row["exact_amdahl"]), abs=0.01, note=note))
        return specs
    if claim_id.endswith("_gna_share"):
        return [spec(claim_id, value, abs=1.0, note="paper prints an approximate whole percent")]
    if row["metric"] == "e2e_limit":
        return [spec(claim_id, round(value, 2), abs=1e-9, note=f"1 / (1 - share) with the share rounded as printed; "
                                                                f"exact share gives {row['exact_share_limit']:.3f}")]
    if claim_id == "hunyuan_sparsity":
        return [spec(claim_id, value, abs=0.5, note="paper prints ~91%")]
    # Simulator columns and exact derived numbers: rounded as the paper prints them, they must be equal.
    decimals = _decimals(claim_id)
    tiles = f"; Q tile {row['q_tile']}, KV tile {row['kv_tile']}" if isinstance(row.get("q_tile"), str) else ""
    note = f"unrounded {value:.4f}, compared at the paper's {decimals} decimals{tiles}"
    if row["metric"] == "e2e_sim_speedup":
        note += f"; Amdahl of the op speedup at 1 decimal, exact Amdahl {float(row['exact_amdahl']):.4f}"
    specs = [spec(claim_id, round(value, decimals), note=note)]
    if claim_id.endswith("_sim") and f"{claim_id}_e2e_repro" in known:
        specs.append(spec(f"{claim_id}_e2e_repro", float(row["exact_amdahl"]), abs=0.01,
                          note=f"claims-table re-derivation: exact Amdahl {float(row['exact_amdahl']):.4f}"))
    return specs


def _counted_once(specs: list[tuple[tuple, dict]], origins: dict[str, str]) -> list[ClaimCheck]:
    """One check per spec; where several claims state one quantity (Tables 5-6 restate Tables 2 and 4, §5 restates
    table cells, the claims table re-derives printed numbers), the first the paper prints counts (else the first)
    and the others are "same quantity" pointing to it."""
    counting: dict[tuple, str] = {}
    # printed before derived; a FLOP-wise claim before a simulation equal to it (stable otherwise)
    for quantity, kw in sorted(specs, key=lambda s: (origins.get(s[1]["claim_id"]) != "verbatim",
                                                     "_flopwise" not in s[1]["claim_id"])):
        counting.setdefault(quantity, kw["claim_id"])
    # A paper value the claims table derived counts only where nothing printed states its quantity: a re-run of the
    # tile model is the simulation its end-to-end cell already counts (``fallback``), and so are the claims that
    # state the same op-level quantity.
    for quantity, kw in specs:
        fallback = kw.get("fallback")
        if counting[quantity] == kw["claim_id"] and origins.get(kw["claim_id"]) != "verbatim" and fallback in counting:
            counting[quantity] = counting[fallback]
    checks = []
    for quantity, kw in specs:
        kw = {k: v for k, v in kw.items() if k != "fallback"}
        first = counting[quantity]
        checks.append(check_value(PAPER, **kw, same_as="" if first == kw["claim_id"] else first))
    return checks


def check_claims(rows, untiled: list[str]) -> list[ClaimCheck]:
    """The rows' checks (one per claim, claims of one quantity counted once, :func:`_counted_once`), the §3.2
    condition, and "not run" for ``untiled``: the simulator claims of configurations whose tiles the paper does not
    state."""
    checks: list[ClaimCheck] = []
    origins = _origins()
    if rows is not None and len(rows) and "claim_id" in rows:
        flop = _flop_ratios(rows)
        specs = [spec for _, row in rows[rows["claim_id"].notna()].iterrows() for spec in _specs(row, origins, flop)]
        # Op-level simulated speedups of the tables, against the claims table's re-run of a tile model (a paper value
        # the claims table derived, not one printed): the same simulation the configuration's end-to-end cell counts
        # (at 0 initial self-attention steps), so it is that quantity, not one of its own.
        op = rows[(rows["metric"] == "op_sim_speedup") & rows["claim_id"].isna()]
        for _, row in op.iterrows():
            config = f"w{row['window']}_s{row['stride']}_sa{int(row['sa_steps'])}"
            claim_id = f"{row['table']}_{row['model']}_{config}_sim_op_repro"
            if claim_id in origins:
                as_flop = _as_flop_ratio(row, flop, claim_id)
                quantity, evidence = as_flop if as_flop is not None else (_quantity(row), row_evidence(row, "gna_simulator"))
                specs.append((quantity, dict(claim_id=claim_id, value=round(float(row["value"]), _decimals(claim_id)),
                                             note="op-level worst-query-tile bound", evidence=evidence,
                                             fallback=("e2e_sim_speedup",) + _quantity(row)[1:] + ("0",))))
        checks += _counted_once(specs, origins)
        if "metric" in rows:
            checks.append(_paper_condition_check(rows))
    mapped = {c.claim_id for c in checks}
    checks += [not_run(PAPER, claim_id, "the paper does not state Cosmos' tile shapes", evidence="simulated")
               for claim_id in untiled if claim_id not in mapped]
    return checks
