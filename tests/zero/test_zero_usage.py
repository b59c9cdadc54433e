"""How other code uses the optimizers: an LR scheduler, gradient accumulation over micro-batches (the pipeline
helper's ZeRO-1 over a dp group), and an evaluation pass between stage-3 training steps. Single process."""

import pytest
import torch

from repro.dist.comm import CommGroup
from repro.models import GPTModel
from repro.zero import STAGE_CLASSES, ZeroConfig, ZeroStage1, build_zero_optimizer
from zero_cases import LR, TINY, batch


def _model():
    torch.manual_seed(0)
    return GPTModel(TINY)


def test_lr_scheduler_drives_the_wrapped_optimizer():
    model = _model()
    optimizer = ZeroStage1(model.parameters(), dp_group=CommGroup.single("dp"), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.0 if step == 0 else 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    ids, labels = batch(0)
    optimizer.backward(model.loss(ids, labels).mean())
    optimizer.step()  # lr = 0: weight decay and the update both vanish
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    scheduler.step()
    optimizer.zero_grad()
    optimizer.backward(model.loss(ids, labels).mean())
    optimizer.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_gradient_accumulation_equals_one_large_batch(stage):
    ids, labels = batch(0)
    results = []
    for chunks in (1, 2):
        model = _model()
        optimizer = build_zero_optimizer(model, ZeroConfig(stage=stage), dp_group=CommGroup.single("dp"), lr=LR)
        for part_ids, part_labels in zip(ids.chunk(chunks), labels.chunk(chunks)):
            optimizer.backward(model.loss(part_ids, part_labels).mean() / chunks)
        optimizer.step()
        optimizer.zero_grad()
        results.append(model.loss(ids, labels).mean().item())
        optimizer.close()
    assert results[0] == pytest.approx(results[1], rel=1e-6)


def test_stage3_evaluation_between_steps_changes_nothing():
    losses = []
    for evaluate in (False, True):
        model = _model()
        optimizer = build_zero_optimizer(model, ZeroConfig(stage=3), dp_group=CommGroup.single("dp"), lr=LR)
        for step in range(4):
            ids, labels = batch(step)
            if evaluate:
                with torch.no_grad():
                    model.loss(ids, labels)
                optimizer.release_all()
            loss = model.loss(ids, labels).mean()
            optimizer.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        optimizer.close()
    assert losses[:4] == losses[4:]


def test_stage_classes_are_the_four_stages():
    assert [cls.stage for cls in STAGE_CLASSES.values()] == [0, 1, 2, 3]
    for lower, higher in zip(list(STAGE_CLASSES.values()), list(STAGE_CLASSES.values())[1:]):
        assert issubclass(higher, lower)  # each stage adds one idea to the previous one


def _bert_mlm_losses(zero_stage: int | None, groups=None, steps: int = 6) -> list[float]:
    """Masked-LM training of a tiny BERT (tied LM head); ``zero_stage`` None is plain AdamW in one process."""
    from repro.models import BertConfig, BertModel

    config = BertConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16,
                        hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = BertModel(config)
    if zero_stage is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    else:
        optimizer = build_zero_optimizer(model, ZeroConfig(stage=zero_stage), dp_group=groups.dp, lr=LR)
    losses = []
    for step in range(steps):
        ids, labels = batch(step)
        rows = slice(None) if groups is None else slice(groups.dp_rank * 4, groups.dp_rank * 4 + 4)
        ids, labels = ids[rows], labels[rows]
        sequence, _ = model(ids, torch.zeros_like(ids))
        loss = model.mlm_loss(sequence, labels).mean()
        if zero_stage is None:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        else:
            optimizer.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            value = loss.detach().clone()
            torch.distributed.all_reduce(value)
            losses.append(value.item() / groups.dp_size)
    if zero_stage is not None:
        optimizer.close()
    return losses


def _stage3_bert_rank(rank, world_size):
    from repro.dist import init_parallel

    return _bert_mlm_losses(3, init_parallel(tp=1))


def test_stage3_partitions_bert_with_its_tied_lm_head():
    """BERT's masked-LM head uses the word embedding and its own bias inside the head's forward; stage 3 gathers
    both there, and two data-parallel ranks train exactly like one process."""
    from repro.dist import spawn

    reference = _bert_mlm_losses(None)
    for losses in spawn(_stage3_bert_rank, 2, timeout_s=120):
        assert losses == pytest.approx(reference, rel=1e-5)


class _TiedToy(torch.nn.Module):
    """Not a repro model: an embedding whose weight the model's own forward reuses as the output layer, declared to
    stage 3 the way any model declares a parameter used outside the sub-module that owns it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh())

    def zero_external_parameters(self) -> dict[torch.nn.Module, list[torch.nn.Parameter]]:
        return {self: [self.embed.weight]}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.body(self.embed(ids)) @ self.embed.weight.t()


def test_stage3_trains_any_module_that_declares_its_tied_parameters():
    """ZeRO knows no model class: a module's zero_external_parameters() is all stage 3 needs to gather a tied
    weight for its other user; three steps equal stage 0's (the same update, unpartitioned)."""
    ids = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(3))
    losses = {}
    for stage in (0, 3):
        torch.manual_seed(0)
        model = _TiedToy()
        optimizer = build_zero_optimizer(model, ZeroConfig(stage=stage), dp_group=CommGroup.single("dp"), lr=LR)
        losses[stage] = []
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            optimizer.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses[stage].append(loss.item())
        optimizer.close()
    assert losses[3] == pytest.approx(losses[0], rel=1e-6) and losses[0][2] < losses[0][0]
