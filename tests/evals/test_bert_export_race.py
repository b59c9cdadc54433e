"""A BERT finetuned by ``python -m evals race-finetune`` and exported by ``repro export-hf`` gives the same RACE
predictions, hence accuracy, through ``transformers`` as through the harness (the other BERT exports:
test_bert_export.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from evals.checkpoint_formats import load_checkpoint  # noqa: E402
from evals.multiple_choice import MultipleChoiceModel  # noqa: E402
from repro.testing import needs  # noqa: E402
from test_bert_export import export_checked  # noqa: E402


@needs("datasets", "tokenizers")  # RACE is read through datasets, tokenized with tokenizers' WordPiece
def test_a_model_finetuned_on_race_predicts_the_same_through_transformers(tmp_path, data_dir):
    from evals.loaders import load_race
    from evals.race_data import questions_of, tokenize_questions
    from evals.race_finetune import accuracy_by_level, predict
    from repro.text.tokenization import bert_tokenizer

    done = subprocess.run([sys.executable, "-m", "evals", "--no-write", "--quiet", "race-finetune",
                           "--train-limit", "16", "--eval-limit", "4", "--max-steps", "2", "--batch-size", "4",
                           "--max-seq-length", "64", "--save", str(tmp_path / "race")], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = export_checked(tmp_path / "race", tmp_path / "hf")
    assert "and the BERT uncased WordPiece tokenizer" in out and (tmp_path / "hf" / "vocab.txt").is_file()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("Hello RACE")["input_ids"] == [101, *bert_tokenizer(data_dir).encode("Hello RACE"), 102]

    hf = transformers.AutoModelForMultipleChoice.from_pretrained(tmp_path / "hf").eval()
    ours = load_checkpoint(tmp_path / "race", expect="bert_multiple_choice")
    model = MultipleChoiceModel(ours.config)
    model.load_state_dict(ours.state_dict)
    model.eval()  # the finetuned model's config keeps its dropout

    class Exported(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hf = hf

        def forward(self, ids, types, mask):
            return self.hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits

    questions = [q for level in ("middle", "high")
                 for q in questions_of(load_race("dev", level, data_dir).records[:2], level)[:6]]
    data = tokenize_questions(questions, bert_tokenizer(data_dir), max_seq_length=64)
    with torch.no_grad():
        scores_ours = model(data.input_ids, data.token_type_ids, data.attention_mask)
        scores_hf = Exported()(data.input_ids, data.token_type_ids, data.attention_mask)
    torch.testing.assert_close(scores_hf, scores_ours, atol=1e-5, rtol=0)
    assert accuracy_by_level(predict(Exported(), data, progress=False), data.labels, data.levels) == \
        accuracy_by_level(predict(model, data, progress=False), data.labels, data.levels)
