"""``repro export-hf`` of BERT checkpoints: RACE's finetuned multiple-choice model and a pretraining BERT, in both
LayerNorm placements (post-LN as ``Bert*``, Megatron's pre-LN as ``MegatronBert*``), load in ``transformers`` with
the same outputs (1e-5) and read back into repro unchanged. Marked ``datasets_free`` (tests/evals/conftest.py): the
finetuned RACE model's export, which reads RACE through datasets, is test_bert_export_race.py."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from evals.checkpoint_formats import load_checkpoint  # noqa: E402
from evals.checkpoints import save_consolidated  # noqa: E402
from evals.multiple_choice import MultipleChoiceModel  # noqa: E402
from repro import cli  # noqa: E402
from repro.models import BertConfig, BertModel, merge_state_dicts  # noqa: E402

pytestmark = pytest.mark.datasets_free

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


def _repro(*args: str) -> tuple[int, str, str]:
    """``repro ARGS`` run in this process: its exit status, stdout and stderr (the exit status and the one line of
    a refusal in a process of its own: test_a_model_repro_does_not_have_is_one_line)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(args))
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def export_checked(checkpoint, out) -> str:
    code, _, err = _repro("export-hf", str(checkpoint), str(out), "--data-dir", "/nonexistent")
    assert code == 2 and "--data-dir /nonexistent" in err, err  # a data directory given must exist
    code, printed, err = _repro("export-hf", str(checkpoint), str(out))
    assert code == 0, printed + err
    return printed


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
    assert hf_class in export_checked(tmp_path / "race", tmp_path / "hf")
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
    export_checked(tmp_path / "bert", tmp_path / "hf")
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


def test_a_model_repro_does_not_have_is_one_line(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    done = subprocess.run([*EXPORT, str(tmp_path / "llama"), str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert "model_type 'llama'" in done.stderr and "GPT-2 ('gpt2'), BERT ('bert')" in done.stderr
    assert not (tmp_path / "out").exists()  # a refused export writes nothing
