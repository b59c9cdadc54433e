"""Megatron-LM Table 3's size trend, measured scaled down (``megatron_size_trend``): the experiment's declarations,
the commands it runs as a user would, the derived claim it decides, and the rule on constructed rows (every step
down beyond the seed spread -> reproduced; a step within it -> agrees, not decisive; a rise -> differs)."""

from __future__ import annotations

import pandas as pd
import pytest

from repro import claims as C
from repro.experiments import validate_experiment
from repro.experiments import megatron_size_trend as T
from repro.paper import CLAIMS_FILE, DERIVED_FILE, load_claims
from repro.results import REPO_ROOT, load_rows


def _rows(perplexity: dict[int, list[float]], scale: str = "paper") -> pd.DataFrame:
    """Rows as run_point writes them: one adjusted perplexity per (size, seed)."""
    records = []
    for params, values in perplexity.items():
        for seed, value in enumerate(values, 1):
            records.append(dict(experiment=T.EXPERIMENT.name, scale=scale, point=f"p{params}", run_id=scale,
                                metric=T.METRIC, value=value, unit="perplexity", params=params, hidden=params // 1000,
                                layers=2, heads=2, seed=seed, steps=40, train_tokens=10240, eval_tokens=4096))
    return pd.DataFrame(records)


def _check(perplexity: dict[int, list[float]]):
    (check,) = T.claims(_rows(perplexity))
    return check


def test_declarations_fix_every_setting_before_a_run():
    exp = T.EXPERIMENT
    assert validate_experiment(exp) == [] and exp.decided_at == {T.CLAIM: "paper"}
    paper = exp.points_for("paper")
    sizes = [p.params["sizes"][0] for p in paper]
    params = [T.parameters(s, p.params["seq_len"]) for s, p in zip(sizes, paper)]
    assert len(paper) >= T.MIN_SIZES and params == sorted(params) and len(set(params)) == len(params)
    assert [round(p / 1e6, 1) for p in params] == [3.3, 6.9, 14.5]
    shared = [{k: v for k, v in p.params.items() if k != "sizes"} for p in paper]
    assert all(s == shared[0] for s in shared)  # same tokens, steps, schedule, seeds and evaluation for every size
    assert len(shared[0]["seeds"]) >= T.MIN_SEEDS
    (ci,) = exp.points_for("ci")  # two tiny sizes, one seed: exercises the path, cannot decide
    assert len(ci.params["sizes"]) == 2 and ci.params["seeds"] == [1]
    assert set(exp.metrics) >= {T.METRIC, "token_perplexity", "train_loss"}


def test_the_commands_are_a_users_commands():
    """What run_point runs parses with repro train's and repro eval's own parsers, to the point's settings."""
    from evals.cli import build_parser as eval_parser
    from repro.training.cli import build_parser as train_parser

    p = T.EXPERIMENT.points_for("paper")[-1].params
    size = p["sizes"][0]
    argv = T.train_command(size, p, 2, REPO_ROOT / "data", REPO_ROOT / "ckpt")
    assert argv[:2] == ["-m", "repro.training"]
    args = train_parser().parse_args(argv[2:])
    assert (args.hidden, args.layers, args.heads, args.seq_len, args.steps, args.lr, args.lr_warmup_iters,
            args.lr_decay_style, args.seed, args.micro_batch_size * args.micro_batches) == (
        256, 2, 8, 128, 40, 3e-3, 4, "cosine", 2, 2)
    argv = T.eval_command(p, REPO_ROOT / "ckpt", REPO_ROOT / "out")
    assert argv[:2] == ["-m", "evals"]
    args = eval_parser().parse_args(argv[2:])
    assert (args.command, args.seq_len, args.stride, args.max_tokens, args.limit) == ("wikitext", 128, 64, 4096, 1)


def test_the_derived_claim_is_apart_from_the_papers_copy():
    claims = load_claims().set_index(["paper", "claim_id"])
    row = claims.loc[(T.PAPER, T.CLAIM)]
    assert (row["value"], row["verbatim_or_derived"], row["source"]) == (
        "decreasing", "derived", "derived from MEG-A: Table 3")
    assert T.CLAIM not in pd.read_csv(CLAIMS_FILE)["claim_id"].values  # the copy of the shared table is untouched
    assert list(pd.read_csv(DERIVED_FILE).columns) == list(pd.read_csv(CLAIMS_FILE).columns[:9])
    for printed in ("t3_355M_wt103_ppl", "t3_2p5B_wt103_ppl", "t3_8p3B_wt103_ppl"):
        assert claims.loc[(T.PAPER, printed), "verbatim_or_derived"] == "verbatim"


def test_a_derived_claim_must_say_so(tmp_path):
    bad = pd.read_csv(DERIVED_FILE).assign(verbatim_or_derived="verbatim")
    bad.to_csv(tmp_path / "derived.csv", index=False)
    with pytest.raises(ValueError, match="must have verbatim_or_derived 'derived'"):
        load_claims(CLAIMS_FILE, derived=tmp_path / "derived.csv")
    clash = pd.read_csv(DERIVED_FILE).assign(claim_id="t3_355M_wt103_ppl")
    clash.to_csv(tmp_path / "clash.csv", index=False)
    with pytest.raises(ValueError, match="must be unique"):
        load_claims(CLAIMS_FILE, derived=tmp_path / "clash.csv")


@pytest.mark.parametrize("perplexity, verdict, null_within", [
    # every step down beyond the seed spread (largest max-min at one size: 4): the null fails
    ({3_000_000: [100, 102, 104], 7_000_000: [90, 91, 92], 14_000_000: [80, 81, 82]}, "reproduced", False),
    # the second step (90 -> 87) within the spread: noise around one perplexity could give it
    ({3_000_000: [100, 102, 104], 7_000_000: [89, 90, 91], 14_000_000: [86, 87, 88]}, "agrees, not decisive", True),
    # the edge: a step equal to the spread is within it
    ({3_000_000: [100, 102, 104], 7_000_000: [95, 96, 97], 14_000_000: [91, 92, 93]}, "agrees, not decisive", True),
    # a rise within the spread: differs, and the null would agree
    ({3_000_000: [100, 102, 104], 7_000_000: [90, 91, 92], 14_000_000: [91, 92, 93]}, "differs", True),
    # a rise at every step, beyond the spread: differs, the null fails too
    ({3_000_000: [80, 81, 82], 7_000_000: [90, 91, 92], 14_000_000: [100, 101, 102]}, "differs", False),
])
def test_the_rule_on_constructed_rows(perplexity, verdict, null_within):
    check = _check(perplexity)
    spread = max(max(v) - min(v) for v in perplexity.values())
    assert (check.verdict, check.null_value, check.null_within) == (verdict, spread, null_within)
    assert check.null == "no size effect (seed spread)" and check.evidence == "measured"
    assert check.basis == T.BASIS and "measured, scaled down" in check.note and "3.0M, 7.0M, 14.0M" in check.note
    assert str(check.reproduced_value).startswith("decreasing" if verdict != "differs" else "not decreasing")
    if verdict == "differs" and null_within:
        assert f"the null (no size effect (seed spread): {spread:g}) would agree" in check.note


def test_too_few_sizes_or_seeds_cannot_decide():
    two_sizes = _check({1_000_000: [10, 11, 12], 2_000_000: [5, 6, 7]})
    one_seed = _check({1_000_000: [10], 2_000_000: [8], 3_000_000: [6]})
    for check in (two_sizes, one_seed):
        assert check.verdict == "not decidable" and "needs at least 3 sizes and 3 seeds" in check.note


def test_ci_rows_take_the_paper_scales_verdict():
    ci = _rows({800_000: [1000.0], 1_600_000: [900.0]}, scale="ci")
    alone = C.collect_checks([T.EXPERIMENT], ci, scale="ci").checks.set_index("claim_id").loc[T.CLAIM]
    assert alone["verdict"] == "not decidable" and "scale paper can" in alone["note"]
    paper = _rows({3_000_000: [100, 102, 104], 7_000_000: [90, 91, 92], 14_000_000: [80, 81, 82]})
    both = pd.concat([ci, paper], ignore_index=True)
    row = C.collect_checks([T.EXPERIMENT], ci, scale="ci", all_rows=both).checks.set_index("claim_id").loc[T.CLAIM]
    assert (row["verdict"], row["scale"]) == ("reproduced", "paper")


def test_the_committed_paper_run():
    """The committed run: 3 sizes x 3 seeds through repro train and repro eval; its verdict follows the rule from
    its own spread."""
    rows = load_rows(REPO_ROOT / "results", experiments=[T.EXPERIMENT.name], scale="paper")
    runs = rows[rows["metric"] == T.METRIC]
    assert len(runs) == 9 and set(runs["seed"]) == {1, 2, 3} and runs["params"].nunique() == 3
    assert set(runs["prov_device"].str.split().str[0]) == {"cpu"}
    by_size = runs.groupby("params")["value"]
    spread = float((by_size.max() - by_size.min()).max())
    means = by_size.mean().sort_index().tolist()
    steps = [a - b for a, b in zip(means, means[1:])]
    (check,) = T.claims(rows)
    assert check.null_value == pytest.approx(spread)
    expected = ("reproduced" if all(s > spread for s in steps) else
                "agrees, not decisive" if all(s > 0 for s in steps) else "differs")
    assert check.verdict == expected


def test_the_figure_draws_each_seed_and_the_papers_models(tmp_path):
    pytest.importorskip("matplotlib", reason="needs the optional package matplotlib (pip install matplotlib)")
    import json

    rows = _rows({3_000_000: [100, 102, 104], 7_000_000: [90, 91, 92], 14_000_000: [80, 81, 82]})
    files = T.EXPERIMENT.figure(rows, load_claims(), tmp_path)
    assert [f.name for f in files] == ["megatron_size_trend.png", "megatron_size_trend.svg", "megatron_size_trend.json"]
    drawn = json.dumps(json.loads(files[2].read_text()))
    for value in ("19.31", "12.76", "10.81", "102.0", "81.0"):  # Table 3's models; the measured means
        assert value in drawn, value
    assert T.EXPERIMENT.figure(rows.iloc[0:0], load_claims(), tmp_path) == []
