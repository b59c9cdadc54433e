"""The same checkpoint gives the same numbers at tp=1 and tp=2 (two real gloo processes)."""

from __future__ import annotations

import pytest
import torch

from evals import lambada, wikitext
from evals.checkpoints import save_consolidated
from evals.loaders import load_lambada, load_wikitext
from evals.model_builders import load_gpt_for_eval
from evals.tasks import EvalSpec, run_at_tp
from repro.text.tokenization import gpt2_tokenizer
from repro.models import merge_state_dicts

from evals_test_models import tiny_gpt


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_gpt_ckpt")
    model = tiny_gpt(dtype=torch.float64)
    save_consolidated(path, merge_state_dicts([model.state_dict()], model.config), architecture="gpt",
                      config=model.config)
    return path


def numbers(checkpoint, data_dir, tp_group=None):
    tokenizer = gpt2_tokenizer(data_dir)
    model, _ = load_gpt_for_eval(checkpoint, tokenizer, tp_group=tp_group, dtype=torch.float64)
    texts = load_lambada(data_dir).records[:16]
    lam = lambada.evaluate_lambada(model, tokenizer, texts, progress=False)
    text = load_wikitext("test", data_dir).records
    meg = wikitext.evaluate_megatron(model, tokenizer, text, wikitext.WindowConfig(seq_len=64, stride=16),
                                     max_tokens=400, progress=False)
    return {"acc_strict": lam["strict"].accuracy, "acc_nonstrict": lam["nonstrict"].accuracy,
            "ppl_lm_eval": lam["lm_eval"].perplexity, "token_ppl": meg.token_perplexity,
            "adjusted_ppl": meg.adjusted_perplexity}


def _rank(rank, world_size, checkpoint, data_dir):
    from repro.dist import init_parallel

    return numbers(checkpoint, data_dir, tp_group=init_parallel(tp=world_size).tp)


def test_tp1_equals_tp2_float64(checkpoint, data_dir):
    from repro.dist import spawn

    reference = numbers(checkpoint, data_dir)
    per_rank = spawn(_rank, 2, checkpoint, data_dir, timeout_s=300)
    assert per_rank[0] == per_rank[1]  # every tp rank computes the same numbers
    for key, value in reference.items():
        assert per_rank[0][key] == pytest.approx(value, rel=1e-10), key


def test_task_runner_rows_equal_across_tp(checkpoint, data_dir):
    spec = EvalSpec(task="lambada", checkpoint=str(checkpoint), data_dir=str(data_dir), limit=12, progress=False)
    one = run_at_tp(spec)
    two = run_at_tp(EvalSpec(**{**spec.__dict__, "tp": 2}))
    assert [r["metric"] for r in one] == [r["metric"] for r in two]
    for a, b in zip(one, two):
        assert a["definition"] == b["definition"] and a["checkpoint_sha256"] == b["checkpoint_sha256"]
        assert b["value"] == pytest.approx(a["value"], rel=1e-5), (a["metric"], a["definition"])
