"""Evaluation throughput: repro's harness against lm-eval (its Hugging Face model class, HFLM) on the same model
and the same data, with identical numbers. Goal: repro tokens/s >= 1.0x lm-eval's.

The model is a GPT-2 built locally from a config (random weights, 4 layers, hidden 256, 128 positions), saved in
Hugging Face format; lm-eval runs it through HFLM, repro converts the same files into its GPT. Workload: LAMBADA
(first 500 passages, lm-eval definition) and WikiText-103 test (first 3 articles, lm-eval's rolling windows).
Throughput counts the tokens the model reads (the same for both).

Run: ``python -m pytest bench/test_evals_bench.py --benchmark-only -s``
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from repro.text.wikitext_articles import split_articles

N_LAMBADA, N_ARTICLES, POSITIONS, BATCH = 500, 3, 128, 32


def _write(path, rows):
    with open(path, "w") as handle:
        for r in rows:
            handle.write(json.dumps(r) + "\n")
    return path


def test_eval_throughput_vs_lm_eval(benchmark, tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")
    pytest.importorskip("datasets")  # evals.loaders reads LAMBADA and WikiText-103 with it
    from lm_eval.models.huggingface import HFLM

    from evals import lambada, wikitext
    from evals.lm_eval_adapter import local_task, run_lm_eval
    from evals.loaders import load_lambada, load_wikitext
    from evals.model_builders import load_gpt_for_eval
    from repro.text.tokenization import gpt2_tokenizer

    tok = gpt2_tokenizer()
    texts = load_lambada().records[:N_LAMBADA]
    pages = split_articles(load_wikitext("test").records)[:N_ARTICLES]
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=POSITIONS, n_embd=256, n_layer=4, n_head=4,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf_model = transformers.GPT2LMHeadModel(config).eval()
    hf_model.save_pretrained(tmp_path / "hf")
    ours_model, _ = load_gpt_for_eval(tmp_path / "hf", tok)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tok.backend, eos_token="<|endoftext|>",
                                                  bos_token="<|endoftext|>")
    hflm = HFLM(pretrained=hf_model, tokenizer=hf_tok, batch_size=BATCH, max_length=POSITIONS)
    tasks = [local_task("lambada_openai", _write(tmp_path / "l.jsonl", [{"text": t} for t in texts])),
             local_task("wikitext", _write(tmp_path / "w.jsonl", [{"page": p} for p in pages]))]

    # tokens read by the model: every request's (truncated) input
    lam_requests = lambada.build_requests(texts, tok, "lm_eval")
    doc_requests = [w for p in pages for w in wikitext.rolling_windows(
        tok.encode(wikitext.wikitext_detokenize(p)), POSITIONS, tok.eod_id)]
    n_tokens = sum(min(len(c) + len(x) - 1, POSITIONS) for c, x in lam_requests + doc_requests)

    def run_ours():
        lam = lambada.evaluate_lambada(ours_model, tok, texts, definitions=["lm_eval"], batch_size=BATCH,
                                       progress=False)["lm_eval"]
        doc = wikitext.evaluate_documents(ours_model, tok, pages, batch_size=BATCH, progress=False)
        return {"acc": lam.accuracy, "ppl": lam.perplexity, "word_ppl": doc.word_perplexity, "bpb": doc.bits_per_byte}

    def run_theirs():
        res = run_lm_eval(hflm, tasks)
        lam, wiki = res["repro_local_lambada_openai"], res["repro_local_wikitext"]
        return {"acc": lam["acc,none"], "ppl": lam["perplexity,none"], "word_ppl": wiki["word_perplexity,none"],
                "bpb": wiki["bits_per_byte,none"]}

    times = {"repro": [], "lm_eval": []}
    results = {}
    for _ in range(2):  # interleaved rounds; the faster round of each counts
        for name, fn in (("repro", run_ours), ("lm_eval", run_theirs)):
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    for key in results["repro"]:
        assert results["repro"][key] == pytest.approx(results["lm_eval"][key], rel=1e-5), key
    ours_tps, theirs_tps = n_tokens / min(times["repro"]), n_tokens / min(times["lm_eval"])
    ratio = ours_tps / theirs_tps
    benchmark.extra_info.update(tokens=n_tokens, repro_tokens_per_s=ours_tps, lm_eval_tokens_per_s=theirs_tps,
                                ratio=ratio, goal=1.0, repro=results["repro"], lm_eval=results["lm_eval"])
    print(f"\neval throughput on {n_tokens:,} tokens: repro {ours_tps:,.0f} tok/s, lm-eval (HFLM) "
          f"{theirs_tps:,.0f} tok/s, ratio {ratio:.2f} (goal >= 1.0); numbers repro {results['repro']} "
          f"lm-eval {results['lm_eval']}")
    benchmark.pedantic(run_ours, rounds=1, iterations=1)
