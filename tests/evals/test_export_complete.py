"""``repro export-hf`` always writes a complete Hugging Face directory or refuses: GPT-2's tokenizer for a GPT of at
least GPT-2's vocabulary (padded above it too), from the data directory or an installed wheel's copies, and one line
with nothing written where neither has it; a tied tensor stored once (no ``lm_head.weight`` beside ``wte``, half
the bytes); the export gives the checkpoint's logits in ``transformers`` (the wheel's copies: test_packaging.py)."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch

from evals.checkpoints import save_consolidated
from evals.hf_export import main as export_main
from repro.models import GPTConfig, GPTModel, merge_state_dicts
from repro.models.reference import ReferenceGPT
from repro.text import data_files as D

#: reads no data through datasets or lm_eval: runs without them (tests/evals/conftest.py), not again in
#: test_evals_without_datasets.py
pytestmark = pytest.mark.datasets_free


def _gpt(root, vocab_size: int = 50257):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=vocab_size, hidden_size=16, num_layers=1, num_attention_heads=2,
                       max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(config)
    return save_consolidated(root / f"gpt{vocab_size}", merge_state_dicts([model.state_dict()], config),
                             architecture="gpt", config=config), config


def _header(path) -> dict:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8: 8 + length])


@pytest.fixture
def no_data_anywhere(monkeypatch, tmp_path):
    """As an installed wheel built without the data: no $REPRO_DATA, an empty per-user default, no shipped copies."""
    monkeypatch.delenv("REPRO_DATA", raising=False)
    monkeypatch.setattr(D, "in_checkout", lambda: False)
    monkeypatch.setattr(D, "user_data_dir", lambda: tmp_path / "user-data")
    monkeypatch.setattr(D, "SHIPPED_GPT2_DIR", tmp_path / "not-shipped")


def test_export_without_tokenizer_files_refuses_in_one_line(no_data_anywhere, tmp_path, capsys):
    checkpoint, _ = _gpt(tmp_path)
    assert export_main([str(checkpoint), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("repro export-hf: error: data directory ") and \
        "repro data fetch" in err, err
    assert not (tmp_path / "hf").exists()  # nothing written


def test_export_with_the_wheels_copies_is_complete(no_data_anywhere, data_dir, tmp_path, capsys):
    shipped = tmp_path / "not-shipped"
    shipped.mkdir()
    for name in ("gpt2-vocab.json", "gpt2-merges.txt"):
        shutil.copyfile(data_dir / "tokenizers" / name, shipped / name)
    checkpoint, _ = _gpt(tmp_path, vocab_size=50304)  # padded above GPT-2's 50257: still GPT-2's tokenizer
    assert export_main([str(checkpoint), str(tmp_path / "hf")]) == 0
    assert "and the GPT-2 tokenizer" in capsys.readouterr().out
    files = {p.name for p in (tmp_path / "hf").iterdir()}
    assert files == {"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json"}
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 50304


def test_a_toy_vocabulary_is_written_without_a_tokenizer_saying_so(tmp_path, capsys):
    checkpoint, _ = _gpt(tmp_path, vocab_size=96)
    assert export_main([str(checkpoint), str(tmp_path / "hf")]) == 0
    assert "no tokenizer: none here has the model's vocabulary" in capsys.readouterr().out
    assert not (tmp_path / "hf" / "vocab.json").exists()


def test_tied_weights_are_stored_once_and_transformers_gives_the_same_logits(data_dir, tmp_path):
    transformers = pytest.importorskip("transformers")
    checkpoint, config = _gpt(tmp_path)
    assert export_main([str(checkpoint), str(tmp_path / "hf"), "--data-dir", str(data_dir)]) == 0
    header = _header(tmp_path / "hf" / "model.safetensors")
    assert "lm_head.weight" not in header and "transformer.wte.weight" in header
    tensor_bytes = sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    wte = 50257 * 16 * 4
    assert (tmp_path / "hf" / "model.safetensors").stat().st_size < tensor_bytes + 4096 < 2 * wte  # wte once
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", torch_dtype=torch.float64).eval()
    assert hf_model.lm_head.weight.data_ptr() == hf_model.transformer.wte.weight.data_ptr()  # tied on load
    reference = ReferenceGPT(config).double().eval()
    state = torch.load(checkpoint / "model.pt", weights_only=True)
    reference.load_state_dict({k: v.double() for k, v in state.items()})
    ids = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, reference(ids), rtol=0, atol=1e-10)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer("Hello world").input_ids == [15496, 995]
