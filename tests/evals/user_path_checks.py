"""Run by the installed wheel's Python in test_user_path_from_a_wheel.py: the exported Hugging Face directory gives
the consolidated checkpoint's logits in transformers (fp64, 1e-10), and lm-eval's HFLM on it the harness's numbers
on the checkpoint (1e-6). Arguments: CHECKPOINT HF_DIR DATA_DIR. Prints "ok" and each metric."""

import sys
from pathlib import Path

import torch
import transformers
from lm_eval.models.huggingface import HFLM

from evals import lambada, wikitext
from evals.lm_eval_adapter import local_task, run_lm_eval
from evals.loaders import load_lambada, load_wikitext
from evals.model_builders import load_gpt_for_eval
from repro.text.tokenization import gpt2_tokenizer
from repro.models.reference import ReferenceGPT
from repro.training.consolidate import load_trained_gpt
from repro.text.wikitext_articles import split_articles

checkpoint, hf_dir, data_dir = (Path(arg) for arg in sys.argv[1:4])
hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float64).eval()
trained = load_trained_gpt(checkpoint)
reference = ReferenceGPT(trained.config).double().eval()
reference.load_state_dict({k: v.double() for k, v in trained.state_dict.items()})
ids = torch.randint(0, trained.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    torch.testing.assert_close(hf_model(ids).logits, reference(ids), rtol=0, atol=1e-10)

tok = gpt2_tokenizer(data_dir)
texts = load_lambada(data_dir).records[:12]
page = "".join(split_articles(load_wikitext("test", data_dir).records)[0].splitlines(keepends=True)[:8])
model, _ = load_gpt_for_eval(checkpoint, tok, dtype=torch.float64)
lam = lambada.evaluate_lambada(model, tok, texts, definitions=["lm_eval"], progress=False)["lm_eval"]
doc = wikitext.evaluate_documents(model, tok, [page], progress=False)
ours = {"acc": lam.accuracy, "ppl": lam.perplexity, "word_ppl": doc.word_perplexity, "bpb": doc.bits_per_byte}

import json, tempfile  # noqa: E401,E402 - the local task files lm-eval reads
tmp = Path(tempfile.mkdtemp())
(tmp / "lambada.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
(tmp / "wikitext.jsonl").write_text(json.dumps({"page": page}) + "\n")
hflm = HFLM(pretrained=hf_model, tokenizer=transformers.AutoTokenizer.from_pretrained(hf_dir), batch_size=8,
            max_length=trained.config.max_position_embeddings)
results = run_lm_eval(hflm, [local_task("lambada_openai", tmp / "lambada.jsonl"),
                             local_task("wikitext", tmp / "wikitext.jsonl")])
lam_r, wiki_r = results["repro_local_lambada_openai"], results["repro_local_wikitext"]
theirs = {"acc": lam_r["acc,none"], "ppl": lam_r["perplexity,none"], "word_ppl": wiki_r["word_perplexity,none"],
          "bpb": wiki_r["bits_per_byte,none"]}
for key in ours:
    assert abs(ours[key] - theirs[key]) <= 1e-6 * max(1.0, abs(theirs[key])), (key, ours[key], theirs[key])
print("ok", json.dumps(ours))
