"""Megatron-LM Table 3's size trend, measured scaled down through a user's own commands: WikiText-103 perplexity
falls as the model grows (355M 19.31, 2.5B 12.76, 8.3B 10.81; the derived claim ``t3_wt103_ppl_falls_with_size``
of ``results/paper/derived_claims.csv``).

Each point trains GPTs of one or more sizes exactly as a user would, in subprocesses: the WikiText-103 valid split is
tokenized by ``python -m repro.training.corpus --wikitext103 valid``, every size is trained by ``python -m
repro.training`` (``repro train``) on those tokens for the same steps, batch and schedule, once per seed (the seed
sets the weights and the order of the training windows), and each trained save directory is scored on the test
split by ``python -m evals wikitext`` (``repro eval wikitext``: Megatron's adjusted perplexity with overlapping
windows, the definition of Table 3, on the first ``eval_tokens`` BPE tokens, the same prefix for every model).

Every setting (sizes, steps, batch, learning rate and schedule, seeds, evaluation window) is fixed here before a run
and never tuned to its outcome. The paper scale's learning rate and schedule are the README's worked example of
``repro train`` on WikiText-103 (peak 3e-3, linear warm-up over the first 10% of the steps, cosine decay); its
sizes (2 layers, hidden 64/128/256, 32 per head: 3.3M, 6.9M and 14.5M parameters with the tied GPT-2 embedding) and
its 40 steps of 2 x 128 tokens (10,240 tokens per run) were sized, before the first run, to what 3 sizes x 3 seeds
cost in about 15 minutes on two shared CPU cores, where the 50,257-way output layer dominates every step (the
committed run took 20 minutes, the machine busy with other jobs). These models are far from converged and their
perplexities are nowhere near the paper's; what they measure is the ordering at an equal token budget, which is all
the claim states. Committed run (2026-11-29): mean adjusted perplexity 7882, 7749 and 7346 at 3.3M, 6.9M and 14.5M
parameters, falling at both steps (by 133 and 403), but the seeds spread by up to 1284 at one size (the largest
model's seeds: 6838 to 8122): "agrees, not decisive". At 10,240 tokens the seed, which also orders the training
windows, moves the perplexity more than a 4.4x larger model does. The three printed perplexities stay mapped by ``eval_wikitext_lambada`` (they need the
paper's models).

The claim (:func:`decide_trend`): the mean perplexity over seeds falls at every step up in size. The null model is
"no size effect": every size the same perplexity, the differences seed noise, measured by the seed spread (the
largest max - min over seeds at any one size; with 3 seeds about 1.7 standard deviations, so a step beyond it is
about two standard errors of a difference of means). Reproduced only when every step down exceeds the spread;
decreasing with a step inside the spread agrees but does not decide; a rise differs. The ``ci`` point (two tiny
sizes, one seed, three steps) exercises the path and cannot decide the claim (``decided_at``: the paper scale).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from repro.experiments.base import Experiment, Point, RunContext
from repro.verdicts import check_condition, not_decidable
from repro.vocabulary import ClaimCheck, Null

PAPER = "megatron_lm_2019"
CLAIM = "t3_wt103_ppl_falls_with_size"
#: Table 3's number: Megatron's adjusted perplexity (normalised by the original word-level token count).
METRIC = "adjusted_perplexity"
BASIS = "megatron_size_trend:wt103_adjusted_ppl_by_size"
MIN_SIZES, MIN_SEEDS = 3, 3
#: GPT-2's BPE vocabulary, the corpus tool's and the evaluation's tokenizer (the model's tied embedding).
VOCAB = 50257

#: Training and evaluation settings per scale (the same for every size and seed of the scale).
CI_RUN = dict(seq_len=32, micro_batch_size=2, micro_batches=1, steps=3, lr=3e-3, warmup=0, decay="cosine",
              seeds=[1], eval_tokens=256, eval_stride=16, eval_batch=16, threads=1, timeout_s=300)
PAPER_RUN = dict(seq_len=128, micro_batch_size=2, micro_batches=1, steps=40, lr=3e-3, warmup=4, decay="cosine",
                 seeds=[1, 2, 3], eval_tokens=4096, eval_stride=64, eval_batch=16, threads=1, timeout_s=1200)
CI_SIZES = ({"layers": 2, "hidden": 16, "heads": 2}, {"layers": 2, "hidden": 32, "heads": 2})
PAPER_SIZES = ({"layers": 2, "hidden": 64, "heads": 2}, {"layers": 2, "hidden": 128, "heads": 4},
               {"layers": 2, "hidden": 256, "heads": 8})
METRICS = ("adjusted_perplexity", "token_perplexity", "train_loss", "train_s", "eval_s")


def parameters(size: Mapping[str, int], seq_len: int) -> int:
    """Parameters of a GPT of ``size`` as ``repro train`` builds it (GPT-2 vocabulary, positions = ``seq_len``)."""
    from repro.models import GPTConfig
    from repro.models.params import count_parameters

    return count_parameters(GPTConfig(vocab_size=VOCAB, hidden_size=size["hidden"], num_layers=size["layers"],
                                      num_attention_heads=size["heads"], max_position_embeddings=seq_len))


def _size_label(params: int) -> str:
    return f"{params / 1e6:.1f}M"


def _paper_label(params: float) -> str:
    return f"{params / 1e9:g}B" if params >= 1e9 else f"{params / 1e6:g}M"


def _environment(threads: int) -> dict[str, str]:
    """The subprocesses run this process's repro and evals (the folder that holds them first on the path)."""
    import repro

    home = str(Path(repro.__file__).resolve().parent.parent)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join([home] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _run(args: Sequence[str], *, cwd: Path, env: dict[str, str], timeout_s: float, what: str) -> float:
    """Run ``python args`` as a user would; the seconds it took, or a RuntimeError with the end of its output."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        tail = (done.stdout[-1500:] + done.stderr[-1500:]).strip()
        raise RuntimeError(f"{what} exited with code {done.returncode}: python {' '.join(args)}\n{tail}")
    return time.perf_counter() - start


def train_command(size: Mapping[str, int], p: Mapping[str, Any], seed: int, data: Path, save: Path) -> list[str]:
    """``repro train`` of one size and seed on the tokens at ``data``, saved to ``save`` (after ``python``)."""
    return ["-m", "repro.training", "--device", "cpu", "--layers", str(size["layers"]), "--hidden",
            str(size["hidden"]), "--heads", str(size["heads"]), "--seq-len", str(p["seq_len"]),
            "--micro-batch-size", str(p["micro_batch_size"]), "--micro-batches", str(p["micro_batches"]),
            "--steps", str(p["steps"]), "--lr", str(p["lr"]), "--lr-warmup-iters", str(p["warmup"]),
            "--lr-decay-style", p["decay"], "--seed", str(seed), "--data", str(data), "--save", str(save),
            "--log-interval", str(p["steps"])]


def eval_command(p: Mapping[str, Any], save: Path, out: Path) -> list[str]:
    """``repro eval wikitext`` of the save directory ``save``, its rows written under ``out`` (after ``python``):
    the test split's first ``eval_tokens`` BPE tokens, windows of the training length every ``eval_stride``
    tokens; ``--limit 1`` keeps lm-eval's per-article definitions, which the command also computes, to one
    article."""
    return ["-m", "evals", "--results-dir", str(out), "--quiet", "--threads", str(p["threads"]), "wikitext",
            "--checkpoint", str(save), "--seq-len", str(p["seq_len"]), "--stride", str(p["eval_stride"]),
            "--max-tokens", str(p["eval_tokens"]), "--limit", "1", "--batch-size", str(p["eval_batch"])]


def _final_loss(save: Path) -> float:
    """The last training loss ``repro train`` logged (its ``end`` event in ``SAVE/log.jsonl``)."""
    ends = [json.loads(line) for line in (save / "log.jsonl").read_text().splitlines() if '"end"' in line]
    return float(ends[-1]["lm_loss"])


def _eval_rows(out: Path) -> dict[str, dict]:
    files = sorted((out / "evals" / "wikitext").glob("*.jsonl"))
    if len(files) != 1:
        raise RuntimeError(f"repro eval wikitext wrote {len(files)} result files under {out}, expected one")
    return {r["metric"]: r for r in map(json.loads, files[0].read_text().splitlines())}


def run_point(point: Point, ctx: RunContext) -> list[dict]:
    """Tokenize WikiText-103 valid once, then train and score every size of the point once per seed."""
    p = point.params
    env = _environment(p["threads"])
    scratch = ctx.scratch_dir
    data = scratch / "wt103-valid"
    _run(["-m", "repro.training.corpus", "--wikitext103", "valid", "--output-prefix", str(data), "--no-progress"],
         cwd=scratch, env=env, timeout_s=p["timeout_s"], what="the corpus tool")
    tokens = p["steps"] * p["micro_batch_size"] * p["micro_batches"] * p["seq_len"]
    rows: list[dict] = []
    for size in p["sizes"]:
        params = parameters(size, p["seq_len"])
        for seed in p["seeds"]:
            tag = f"h{size['hidden']}-l{size['layers']}-s{seed}"
            save, out = scratch / tag / "ckpt", scratch / tag / "eval"
            train_s = _run(train_command(size, p, seed, data, save), cwd=scratch, env=env, timeout_s=p["timeout_s"],
                           what=f"repro train ({tag})")
            eval_s = _run(eval_command(p, save, out), cwd=scratch, env=env, timeout_s=p["timeout_s"],
                          what=f"repro eval wikitext ({tag})")
            scored = _eval_rows(out)
            common = {"size": _size_label(params), "params": params, "layers": size["layers"],
                      "hidden": size["hidden"], "heads": size["heads"], "seed": seed, "steps": p["steps"],
                      "train_tokens": tokens, "eval_tokens": scored["bpe_tokens"]["value"],
                      "data_sha256": scored[METRIC]["data_sha256"], "evidence": "measured"}
            mine = [
                {"metric": METRIC, "value": scored[METRIC]["value"], "unit": "perplexity",
                 "definition": "megatron_adjusted", **common},
                {"metric": "token_perplexity", "value": scored["token_perplexity"]["value"], "unit": "perplexity",
                 "definition": "megatron_token", **common},
                {"metric": "train_loss", "value": _final_loss(save), "unit": "nats", "definition": "last step",
                 **common},
                {"metric": "train_s", "value": train_s, "unit": "s", "definition": "repro train wall time", **common},
                {"metric": "eval_s", "value": eval_s, "unit": "s", "definition": "repro eval wall time", **common},
            ]
            ctx.emit_rows(mine)  # kept if a later size runs out of time
            rows += mine
    return rows


def decide_trend(perplexity: Mapping[int, Sequence[float]], *, note: str = "") -> ClaimCheck:
    """The verdict of the size trend from ``perplexity``: parameters -> one perplexity per seed.

    Holds when the mean over seeds falls at every step up in size. The null, "no size effect" (its value: the seed
    spread, the largest max - min over seeds at one size), holds when some step is within that spread: the
    ordering is then what noise around one common perplexity could give. Fewer than 3 sizes or 3 seeds a size: not
    decidable (no trend, or no spread to set it against)."""
    sizes = sorted(perplexity)
    seeds = min((len(perplexity[s]) for s in sizes), default=0)
    if len(sizes) < MIN_SIZES or seeds < MIN_SEEDS:
        return not_decidable(PAPER, CLAIM, None, evidence="measured", basis=BASIS,
                             reason=f"{len(sizes)} size(s) x {seeds} seed(s): the trend needs at least "
                                    f"{MIN_SIZES} sizes and {MIN_SEEDS} seeds a size (the seed spread)")
    means = [sum(perplexity[s]) / len(perplexity[s]) for s in sizes]
    spread = max(max(perplexity[s]) - min(perplexity[s]) for s in sizes)
    steps = [a - b for a, b in zip(means, means[1:])]  # > 0: perplexity falls from one size to the next
    falls = all(step > 0 for step in steps)
    within = any(abs(step) <= spread for step in steps)
    shown = " > ".join(f"{m:.4g}" for m in means) if falls else ", ".join(f"{m:.4g}" for m in means)
    value = f"{'decreasing' if falls else 'not decreasing'} ({shown})"
    detail = (f"mean adjusted perplexity over {seeds} seeds at {', '.join(_size_label(s) for s in sizes)} "
              f"parameters: {', '.join(f'{m:.4g}' for m in means)}; steps down "
              f"{', '.join(f'{d:.4g}' for d in steps)}; seed spread (largest max-min at one size) {spread:.4g}")
    return check_condition(
        PAPER, CLAIM, value, holds=falls, evidence="measured", basis=BASIS,
        tolerance="the mean perplexity falls at every step up in size, each step beyond the seed spread",
        null=Null("no size effect (seed spread)", spread, holds=within),
        note=f"{detail}; {note}" if note else detail,
        says=("perplexity falls with size", "perplexity does not fall with size"))


def claims(rows) -> list[ClaimCheck]:
    """The derived Table 3 claim from the rows' adjusted perplexities (one per size and seed)."""
    if rows is None or len(rows) == 0:
        return []
    runs = rows[rows["metric"] == METRIC]
    if not len(runs):
        return []
    perplexity: dict[int, list[float]] = {}
    for _, r in runs.iterrows():
        perplexity.setdefault(int(r["params"]), []).append(float(r["value"]))
    first = runs.iloc[0]
    sizes = ", ".join(f"{_size_label(int(p))} (hidden {int(h)}, {int(n)} layers)"
                      for p, h, n in sorted(set(zip(runs["params"], runs["hidden"], runs["layers"]))))
    note = (f"measured, scaled down: GPTs of {sizes} (the paper's 355M, 2.5B, 8.3B) trained by repro train on "
            f"WikiText-103 valid for {int(first['steps'])} steps ({int(first['train_tokens']):,} tokens), scored "
            f"by repro eval wikitext on the first {int(first['eval_tokens']):,} BPE tokens of test; the ordering "
            "only, the perplexities are far from the paper's (not compared)")
    return [decide_trend(perplexity, note=note)]


#: Table 3's perplexity claims and the model sizes they belong to (parameters, as the paper names them).
TABLE3 = {"t3_355M_wt103_ppl": 355e6, "t3_2p5B_wt103_ppl": 2.5e9, "t3_8p3B_wt103_ppl": 8.3e9}


def figure(rows, paper_claims, out_dir: Path) -> list[Path]:
    """Adjusted perplexity against parameters: each seed and the mean here (the deciding scale's rows), beside
    Table 3's three models. Two panels, since the perplexities differ by two orders of magnitude."""
    from repro.optional import require

    matplotlib = require("matplotlib", "the Megatron size-trend figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    from repro.figures.common import caption, legend_below, rows_provenance, save_figure

    if rows is None or len(rows) == 0 or "params" not in rows:
        return []
    scale = "paper" if (rows["scale"] == "paper").any() else str(rows["scale"].iloc[0])
    rows = rows[rows["scale"] == scale].reset_index(drop=True)
    runs = rows[rows["metric"] == METRIC]
    if not len(runs):
        return []
    fig, (here, paper) = plt.subplots(1, 2, figsize=(11, 4.4))
    by_size = runs.groupby("params")["value"]
    sizes = sorted(by_size.groups)
    here.scatter(runs["params"], runs["value"], color="#999999", s=18, label="one seed", zorder=2)
    here.plot(sizes, [by_size.mean()[s] for s in sizes], "o-", color="#55A868", label="mean over seeds", zorder=3)
    here.set(xscale="log", xlabel="parameters", ylabel="adjusted perplexity (WikiText-103 test)",
             title=f"Measured here ({scale} scale, scaled down)")
    legend_below(here)
    table = paper_claims[(paper_claims["paper"] == PAPER) & paper_claims["claim_id"].isin(list(TABLE3))]
    points = sorted((TABLE3[c], float(v)) for c, v in zip(table["claim_id"], table["value_num"]))
    paper.plot([x for x, _ in points], [y for _, y in points], "o-", color="#4C72B0", label="Megatron-LM Table 3")
    paper.set(xscale="log", xlabel="parameters", ylabel="adjusted perplexity (WikiText-103 test)",
              title="Paper (Shoeybi et al. 2019, Table 3)")
    legend_below(paper)
    for ax, ticks in ((here, sizes), (paper, [x for x, _ in points])):
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FixedFormatter([_size_label(x) if x < 1e8 else _paper_label(x) for x in ticks]))
        ax.xaxis.set_minor_locator(NullLocator())
    fig.tight_layout(w_pad=3.0)
    first = runs.iloc[0]
    caption(fig, f"The claim is the ordering: perplexity falls as the model grows. Left: 2-layer GPTs trained by "
                 f"repro train for {int(first['steps'])} steps ({int(first['train_tokens']):,} tokens of WikiText-103 "
                 f"valid), scored by repro eval wikitext on the first {int(first['eval_tokens']):,} BPE tokens of "
                 "test; right: the paper's 355M, 2.5B and 8.3B models, trained on 174 GB of text.")
    return save_figure(fig, out_dir, "megatron_size_trend", rows_provenance(rows, scale))


def _points(sizes, run: dict, *, per_size: bool, memory_gib: float) -> tuple[Point, ...]:
    """One point for every size (a point's seeds run in it), or one point for all of them (one tokenization).
    ``memory_gib`` covers this process and the one ``repro train`` or ``repro eval`` it waits for."""
    if not per_size:
        return (Point("sizes", {"sizes": [dict(s) for s in sizes], **run}, memory_gib=memory_gib),)
    return tuple(Point(f"h{s['hidden']}", {"sizes": [dict(s)], **run}, memory_gib=memory_gib) for s in sizes)


EXPERIMENT = Experiment(
    name="megatron_size_trend",
    paper=PAPER,
    title="WikiText-103 perplexity falls as the model grows (Megatron-LM Table 3), measured scaled down",
    points={"ci": _points(CI_SIZES, CI_RUN, per_size=False, memory_gib=2.0),
            "paper": _points(PAPER_SIZES, PAPER_RUN, per_size=True, memory_gib=3.0)},
    run_point=run_point,
    claims=claims,
    figure=figure,
    description=__doc__ or "",
    budget_s={"ci": 60.0, "paper": 1500.0},
    data=("wikitext103", "tokenizers"),  # trains on WikiText-103 valid, scores on test, with GPT-2's BPE
    metrics=METRICS,
    decided_at={CLAIM: "paper"},
)
