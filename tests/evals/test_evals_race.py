"""RACE: Megatron's sample construction, accuracy by level, and a finetuning loop that learns."""

from __future__ import annotations

import pytest
import torch

from evals.loaders import load_race
from evals.multiple_choice import MultipleChoiceModel
from evals.race_data import RaceQuestion, clean_text, pair_ids, question_with_option, questions_of, tokenize_questions
from evals.race_finetune import FinetuneConfig, accuracy_by_level, finetune, predict
from repro.models import BertConfig


def test_clean_text_and_option_merge():
    assert clean_text("A  b\n\nc . d . . e") == "A b c. d.. e"
    assert question_with_option("The man is _ .", "tired") == "The man is tired ."
    assert question_with_option("Why did he go?", "To eat.") == "Why did he go? To eat."


def test_pair_ids_layout_and_trimming(bert_tok):
    cls, sep, pad = bert_tok.cls_id, bert_tok.sep_id, bert_tok.pad_id
    ids, types, mask = pair_ids([7, 8], [20, 21, 22], 10, bert_tok)
    assert ids == [cls, 7, 8, sep, 20, 21, 22, sep, pad, pad]
    assert types == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    assert mask == [1] * 8 + [0, 0]
    ids, types, mask = pair_ids([7, 8], list(range(100, 120)), 8, bert_tok)  # article cut, final [SEP] kept
    assert ids == [cls, 7, 8, sep, 100, 101, 102, sep] and mask == [1] * 8 and types[-1] == 1


def test_tokenized_samples(bert_tok, data_dir):
    questions = questions_of(load_race("dev", "middle", data_dir).records[:2], "middle")
    data = tokenize_questions(questions, bert_tok, max_seq_length=96)
    assert data.input_ids.shape == (len(questions), 4, 96)
    assert (data.input_ids[:, :, 0] == bert_tok.cls_id).all()
    assert data.labels.tolist() == [q.label for q in questions]
    first = bert_tok.decode(data.input_ids[0, 0][data.attention_mask[0, 0].bool()].tolist())
    assert first.startswith("[CLS] " + clean_text(question_with_option(questions[0].question,
                                                                         questions[0].options[0])).lower()[:20])
    with pytest.raises(ValueError, match="lacks"):
        from repro.text.tokenization import gpt2_tokenizer

        tokenize_questions(questions, gpt2_tokenizer(data_dir), max_seq_length=96)


def test_accuracy_by_level():
    out = accuracy_by_level(torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 0, 0]), ("middle", "middle", "high", "high"))
    assert out["middle"]["accuracy"] == 1.0 and out["high"]["accuracy"] == 0.0
    assert out["all"] == {"correct": 2, "total": 4, "accuracy": 0.5}


def test_finetune_learns_a_small_subset(bert_tok, data_dir):
    questions = questions_of(load_race("train", "middle", data_dir).records[:6], "middle")[:16]
    data = tokenize_questions(questions, bert_tok, max_seq_length=48)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=bert_tok.vocab_size, hidden_size=32, num_layers=1, num_attention_heads=2,
                        max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0)
    model = MultipleChoiceModel(config)
    log = finetune(model, data, FinetuneConfig(epochs=30, batch_size=16, lr=3e-3, warmup_fraction=0.1),
                   progress=False)
    assert log.steps == 30 and log.last_loss < 0.5 * log.first_loss
    accuracy = accuracy_by_level(predict(model, data, progress=False), data.labels, data.levels)["all"]["accuracy"]
    assert accuracy >= 0.9  # it can memorise 16 questions


def test_bad_race_inputs():
    with pytest.raises(ValueError, match="answer 'E'"):
        questions_of([{"questions": ["q"], "options": [["a", "b", "c", "d"]], "answers": ["E"], "id": "x"}], "high")
    with pytest.raises(ValueError, match="3 options"):
        questions_of([{"questions": ["q"], "options": [["a", "b", "c"]], "answers": ["A"], "id": "x"}], "high")
    with pytest.raises(ValueError, match="must be positive"):
        FinetuneConfig(epochs=0)
    assert RaceQuestion("a", "q", ("1", "2", "3", "4"), 0, "high", "x").label == 0
