"""``repro export-hf`` of BERT checkpoints: RACE's finetuned multiple-choice model and a pretraining BERT, in both
LayerNorm placements (post-LN as ``Bert*``, Megatron's pre-LN as ``MegatronBert*``), load in ``transformers`` with
the same outputs (1e-5), read back into repro unchanged, and a model finetuned by ``python -m evals race-finetune``
gives the same RACE predictions, hence accuracy, through ``transformers`` as through the harness."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from evals.checkpoint_formats import load_checkpoint  # noqa: E402
from evals.checkpoints import save_consolidated  # noqa: E402
from evals.multiple_choice import MultipleChoiceModel  # noqa: E402
from repro.models import BertConfig, BertModel, merge_state_dicts  # noqa: E402
from repro.testing import needs  # noqa: E402

EXPORT = [sys.executable, "-m", "repro", "export-hf"]
SHAPE = dict(vocab_size=300, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=40,
             hidden_dropout=0.0, attention_dropout=0.0)


def _inputs(batch: int, choices: int | None = None, seq: int = 24, vocab: int = 300):
    gen = torch.Generator().manual_seed(5)
    shape = (batch, seq) if choices is None else (batch, choices, seq)
    ids = torch.randint(1, vocab, shape, generator=gen)
    types = (torch.arange(seq) >= seq // 2).long().expand(shape).contiguous()
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., seq - 5:] = 0  # padding at the end, as the RACE tokenizer pads
    return ids, types, mask


def _export(checkpoint, out) -> str:
    done = subprocess.run([*EXPORT, str(checkpoint), str(out), "--data-dir", "/nonexistent"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "--data-dir /nonexistent" in done.stderr  # a data directory given must exist
    done = subprocess.run([*EXPORT, str(checkpoint), str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _perturb(model: torch.nn.Module) -> None:
    """LayerNorms and biases away from 1 and 0, so that a misplaced one shows."""
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


@pytest.mark.parametrize("placement,hf_class", [("megatron", "MegatronBertForMultipleChoice"),
                                                ("original", "BertForMultipleChoice")])
def test_multiple_choice_model_exports_with_the_same_scores(tmp_path, placement, hf_class):
    torch.manual_seed(0)
    config = BertConfig(**SHAPE, layernorm_placement=placement)
    model = MultipleChoiceModel(config).eval()
    _perturb(model)
    save_consolidated(tmp_path / "race", merge_state_dicts([model.state_dict()], config),
                      architecture="bert_multiple_choice", config=config)
    assert hf_class in _export(tmp_path / "race", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [hf_class]
    hf = transformers.AutoModelForMultipleChoice.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == hf_class
    ids, types, mask = _inputs(3, 4)
    with torch.no_grad():
        ours = model(ids, types, mask)
        theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    back = load_checkpoint(tmp_path / "hf", expect="bert_multiple_choice")  # and back into repro, unchanged
    original = {k: v for k, v in merge_state_dicts([model.state_dict()], config).items()
                if not k.startswith(("bert.lm_head.", "bert.binary_head."))}  # pretraining heads RACE never uses
    assert set(back.state_dict) == set(original)
    for name, tensor in original.items():
        torch.testing.assert_close(back.state_dict[name][: tensor.shape[0]], tensor, atol=0, rtol=0)


@pytest.mark.parametrize("placement", ["megatron", "original"])
def test_pretraining_bert_exports_with_the_same_outputs(tmp_path, placement):
    torch.manual_seed(1)
    config = BertConfig(**SHAPE, layernorm_placement=placement)
    model = BertModel(config).eval()
    _perturb(model)
    save_consolidated(tmp_path / "bert", merge_state_dicts([model.state_dict()], config), architecture="bert",
                      config=config)
    _export(tmp_path / "bert", tmp_path / "hf")
    hf = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__.endswith("ForPreTraining")
    ids, types, mask = _inputs(2)
    with torch.no_grad():
        sequence, pooled = model(ids, types, mask)
        mlm = model.lm_logits(sequence)[..., : config.vocab_size]
        nsp = model.binary_head(pooled)
        out = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    torch.testing.assert_close(out.prediction_logits, mlm, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.seq_relationship_logits, nsp, atol=1e-5, rtol=0)
    encoder = load_checkpoint(tmp_path / "hf", expect="bert")  # the encoder of the export, as race-finetune --init
    assert encoder.config.layernorm_placement == placement


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
    out = _export(tmp_path / "race", tmp_path / "hf")
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


def test_a_model_repro_does_not_have_is_one_line(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    done = subprocess.run([*EXPORT, str(tmp_path / "llama"), str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert "model_type 'llama'" in done.stderr and "GPT-2 ('gpt2'), BERT ('bert')" in done.stderr
    assert not (tmp_path / "out").exists()  # a refused export writes nothing
