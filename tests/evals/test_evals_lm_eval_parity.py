"""repro's harnesses against lm-eval itself, on the same data and definitions (acceptance: equal to 1e-6).

Two independent routes: (1) lm-eval's own task definitions (YAML + preprocessing + metric aggregation) driving
repro's model through the adapter; (2) lm-eval's Hugging Face model class on a random GPT-2 built locally, against
repro's harness on that model converted into repro's GPT.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from evals import lambada, wikitext
from evals.lm_eval_adapter import as_lm_eval_model, local_task, run_lm_eval
from evals.loaders import load_lambada, load_race, load_wikitext
from evals.race_zeroshot import documents_of, evaluate_race_zeroshot, lm_eval_problems
from evals_test_models import sharpen
from repro.text.wikitext_articles import split_articles

lm_eval = pytest.importorskip("lm_eval")

N_LAMBADA = 24
N_RACE = 6


def write_jsonl(path: Path, rows) -> Path:
    with open(path, "w") as handle:
        for r in rows:
            handle.write(json.dumps(r) + "\n")
    return path


@pytest.fixture(scope="module")
def subsets(data_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm_eval_data")
    texts = load_lambada(data_dir).records[:N_LAMBADA]
    # the head of the first article (its first 12 lines, ~300 BPE tokens): enough for several rolling windows
    first = split_articles(load_wikitext("test", data_dir).records)[0]
    pages = ["".join(first.splitlines(keepends=True)[:12])]
    race = load_race("test", "high", data_dir).records[:N_RACE]
    return {
        "texts": texts, "pages": pages, "race_records": race,
        "lambada_openai": write_jsonl(tmp / "lambada.jsonl", [{"text": t} for t in texts]),
        "wikitext": write_jsonl(tmp / "wikitext.jsonl", [{"page": p} for p in pages]),
        "race": write_jsonl(tmp / "race.jsonl", [{"article": r["article"], "problems": lm_eval_problems(r)}
                                                 for r in race]),
    }


def ours(model, tok, subsets):
    lam = lambada.evaluate_lambada(model, tok, subsets["texts"], definitions=["lm_eval"], progress=False)["lm_eval"]
    doc = wikitext.evaluate_documents(model, tok, subsets["pages"], progress=False)
    race = evaluate_race_zeroshot(model, tok, documents_of(subsets["race_records"], "high"), progress=False)
    return {"acc": lam.accuracy, "ppl": lam.perplexity, "word_ppl": doc.word_perplexity,
            "bpb": doc.bits_per_byte, "byte_ppl": doc.byte_perplexity, "race_acc": race.accuracy("high")}


def theirs(lm, subsets):
    tasks = [local_task(name, subsets[name]) for name in ("lambada_openai", "wikitext", "race")]
    results = run_lm_eval(lm, tasks)
    lam, wiki, race = (results[f"repro_local_{n}"] for n in ("lambada_openai", "wikitext", "race"))
    return {"acc": lam["acc,none"], "ppl": lam["perplexity,none"], "word_ppl": wiki["word_perplexity,none"],
            "bpb": wiki["bits_per_byte,none"], "byte_ppl": wiki["byte_perplexity,none"],
            "race_acc": race["acc,none"]}


def assert_same(a, b):
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-6), key


def test_adapter_under_lm_eval_task_definitions(tiny_lm, gpt2_tok, subsets):
    mine = ours(tiny_lm, gpt2_tok, subsets)
    assert 0 < mine["acc"] < 1, "the test model should get some, not all, LAMBADA passages right"
    assert_same(mine, theirs(as_lm_eval_model(tiny_lm, gpt2_tok, batch_size=8), subsets))


def test_race_prompts_identical_to_lm_eval(data_dir):
    import importlib.util

    path = Path(lm_eval.__file__).parent / "tasks" / "race" / "preprocess_race.py"
    spec = importlib.util.spec_from_file_location("lm_eval_preprocess_race", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    records = load_race("test", "high", data_dir).records
    for record, doc in zip(records, documents_of(records, "high")):
        theirs_doc = {"article": record["article"], "problems": lm_eval_problems(record)}
        assert module.doc_to_text(theirs_doc) == doc.prompt
        assert module.doc_to_choice(theirs_doc) == list(doc.options)
        assert module.doc_to_target(theirs_doc) == doc.label


@pytest.mark.parametrize("vocab_size", [50257, 50304])
def test_hf_gpt2_through_lm_eval_hflm(vocab_size, gpt2_tok, subsets, tmp_path):
    """Also a vocabulary padded above the tokenizer's (nanoGPT's 50,304 rows for GPT-2's 50,257 tokens): lm-eval
    takes the log-softmax and the argmax over every logit, the padded rows' too, and so does the harness."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # lm-eval's HFLM imports it
    from lm_eval.models.huggingface import HFLM

    from evals.model_builders import load_gpt_for_eval

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=16, n_layer=2, n_head=2,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf_model = transformers.GPT2LMHeadModel(config)
    sharpen(hf_model.transformer.wte.weight)
    hf_model = hf_model.double().eval()
    hf_model.save_pretrained(tmp_path)
    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=gpt2_tok.backend,
                                                        eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    hflm = HFLM(pretrained=hf_model, tokenizer=hf_tokenizer, batch_size=8, max_length=64)
    model, _ = load_gpt_for_eval(tmp_path, gpt2_tok, dtype=torch.float64)
    mine = ours(model, gpt2_tok, subsets)
    assert 0 < mine["acc"] < 1
    assert_same(mine, theirs(hflm, subsets))


def test_standard_errors_are_lm_evals(tiny_lm, gpt2_tok, subsets, monkeypatch):
    """lm-eval's own evaluator, asked for standard errors (2,000 bootstrap resamples, its single-process path),
    against the ones the harness puts in its rows: mean_stderr for the accuracies, the bootstrap for LAMBADA's
    perplexity (the same resamples), none for WikiText's weighted perplexities."""
    from evals.stderr import mean_stderr, perplexity_stderrs

    monkeypatch.setenv("DISABLE_MULTIPROC", "1")
    tasks = [local_task(name, subsets[name]) for name in ("lambada_openai", "wikitext", "race")]
    results = run_lm_eval(as_lm_eval_model(tiny_lm, gpt2_tok, batch_size=8), tasks, bootstrap_iters=2000)
    lam, wiki, race = (results[f"repro_local_{n}"] for n in ("lambada_openai", "wikitext", "race"))
    mine = lambada.evaluate_lambada(tiny_lm, gpt2_tok, subsets["texts"], definitions=["lm_eval"],
                                    progress=False)["lm_eval"]
    assert mean_stderr([float(c) for c in mine.correct]) == pytest.approx(lam["acc_stderr,none"], rel=1e-12)
    assert perplexity_stderrs([mine.logprobs], iters=2000)[0] == pytest.approx(lam["perplexity_stderr,none"],
                                                                                rel=1e-6)
    race_mine = evaluate_race_zeroshot(tiny_lm, gpt2_tok, documents_of(subsets["race_records"], "high"),
                                       progress=False)
    assert mean_stderr([float(c) for c in race_mine.correct("high")]) == pytest.approx(race["acc_stderr,none"],
                                                                                       rel=1e-12)
    assert {wiki[f"{m}_stderr,none"] for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")} == {"N/A"}
