"""Partitioned construction and the all-NVMe stage 3 (issue 15): the same numbers as the ordinary path.

- a GPT built partitioned holds, shard by shard, exactly the values ``GPTModel(config)`` draws from the same seed,
  and leaves the generator where the ordinary constructor leaves it (so dropout masks agree too);
- parameters, optimizer states and gradients on NVMe give the in-memory stage 3's fp32 losses (<= 1e-6 relative),
  with accumulation over micro-batches and with clipping;
- memory stays bounded: construction holds one block whole, the NVMe buffers a few sub-groups.
"""

import pytest
import torch

from repro.dist import init_parallel, spawn
from repro.dist.comm import CommGroup
from repro.models import GPTConfig, GPTModel
from repro.zero import OffloadConfig, ZeroConfig, build_zero_optimizer
from repro.models.partitioned_gpt import gpt_blocks
from repro.zero.construction import BlockMaterializer, skeleton
from repro.models.partitioned_gpt import build_partitioned_gpt
from repro.zero.param_units import param_key
from repro.zero.stage3_infinity import ZeroInfinityStage3
from zero_cases import TINY, batch, max_rel_diff

TOLERANCE = 1e-6
DEEP = GPTConfig(vocab_size=64, hidden_size=32, num_layers=6, num_attention_heads=4, max_position_embeddings=16,
                 hidden_dropout=0.1, attention_dropout=0.1)


def _memory_config(**changes) -> ZeroConfig:
    return ZeroConfig(stage=3, bucket_numel=700, max_grad_norm=1.0, **changes)


def _nvme_config(path: str, **changes) -> ZeroConfig:
    offload = OffloadConfig("nvme", nvme_path=path, io_block_bytes=8192)
    return _memory_config(offload_param=offload, offload_optimizer=offload, **changes)


def _shards_equal_ordinary(rank, world_size, config):
    groups = init_parallel(tp=1)
    torch.manual_seed(3)
    ordinary = dict(GPTModel(config).named_parameters())
    after_ordinary = torch.get_rng_state()
    torch.manual_seed(3)
    _, optimizer = build_partitioned_gpt(config, _memory_config(), dp_group=groups.dp, lr=1e-3)
    assert torch.equal(torch.get_rng_state(), after_ordinary), "the generator must end where GPTModel leaves it"
    compared = 0
    for bucket in optimizer.buckets:
        full = bucket.flatten([ordinary[name] for name in bucket.names], dtype=torch.float32, device="cpu")
        lo, hi = bucket.shard_range
        assert torch.equal(optimizer.param_tier.fetch(param_key(bucket)), full[lo:hi]), bucket.names
        compared += len(bucket.names)
    optimizer.close()
    return compared


def test_partitioned_construction_equals_ordinary():
    compared = spawn(_shards_equal_ordinary, 2, DEEP, timeout_s=120)
    assert compared[0] == compared[1] == len(dict(GPTModel(DEEP).named_parameters()))


def test_materializer_holds_one_block_and_keeps_order():
    model = skeleton(lambda: GPTModel(DEEP))
    assert all(p.numel() == 0 for p in model.parameters())  # nothing but placeholders
    blocks = gpt_blocks(DEEP)
    materializer = BlockMaterializer(model, blocks)
    materializer.value("layers.2.mlp.fc1.weight")  # builds the embedding, layers 0, 1 and 2, in order
    assert materializer.built == ["embedding", "layers.0", "layers.1", "layers.2"]
    assert set(materializer.current) == {n for n in dict(model.named_parameters()) if n.startswith("layers.2.")}
    with pytest.raises(RuntimeError, match="construction order"):
        materializer.value("layers.1.mlp.fc1.weight")
    materializer.finish()
    layer_bytes = sum(p.numel() * 4 for p in GPTModel(DEEP).layers[0].parameters())
    embedding_bytes = sum(p.numel() * 4 for p in GPTModel(DEEP).embedding.parameters())
    assert materializer.peak_block_bytes == max(layer_bytes, embedding_bytes)
    assert materializer.current == {}


def _train(groups, config: ZeroConfig, model_config: GPTConfig, *, partitioned: bool, steps: int, micro: int = 1):
    torch.manual_seed(0)
    if partitioned:
        model, optimizer = build_partitioned_gpt(model_config, config, dp_group=groups.dp, lr=1e-2,
                                                 weight_decay=0.1)
    else:
        model = GPTModel(model_config)
        optimizer = build_zero_optimizer(model, config, dp_group=groups.dp, lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(steps):
        ids, labels = batch(step, model_config)
        per_rank = ids.shape[0] // groups.dp_size
        rows = slice(groups.dp_rank * per_rank, (groups.dp_rank + 1) * per_rank)
        total = 0.0
        for part in torch.arange(per_rank).chunk(micro):
            loss = model.loss(ids[rows][part], labels[rows][part]).mean() / micro
            optimizer.backward(loss)
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        value = torch.tensor([total])
        torch.distributed.all_reduce(value)
        losses.append(value.item() / groups.dp_size)
    peak = {name: getattr(tier, "peak_buffer_bytes", 0) for name, tier in
            (("states", optimizer.tier), ("grads", getattr(optimizer, "grad_tier", None)))}
    largest = max(b.layout.shard_numel for b in optimizer.buckets) * 4
    kind = type(optimizer)
    optimizer.close()
    return losses, peak, largest, kind


def _nvme_against_memory(rank, world_size, path, model_config, micro):
    groups = init_parallel(tp=1)
    memory, _, _, _ = _train(groups, _memory_config(), model_config, partitioned=False, steps=8, micro=micro)
    nvme, peak, largest, kind = _train(groups, _nvme_config(path), model_config, partitioned=True, steps=8,
                                       micro=micro)
    return memory, nvme, peak, largest, kind


@pytest.mark.parametrize("model_config,micro", [(TINY, 1), (DEEP, 2)], ids=["tiny", "deep-dropout-accumulate"])
def test_partitioned_nvme_losses_equal_in_memory(tmp_path, model_config, micro):
    memory, nvme, peak, largest, kind = spawn(_nvme_against_memory, 2, str(tmp_path), model_config, micro,
                                              timeout_s=300)[0]
    assert kind is ZeroInfinityStage3
    assert memory[-1] < memory[0], "the in-memory run must learn, or equality would be vacuous"
    assert max_rel_diff(nvme, memory) <= TOLERANCE, (nvme, memory)
    # Bounded memory: the states tier holds two sub-groups' reads (master, two moments) and the writes in
    # flight (max_inflight_writes + 1), never the model; the gradient tier one read ahead and its writes.
    assert peak["states"] <= (2 * 3 + 9) * (largest + 4096), peak
    assert peak["grads"] <= (2 + 9) * (largest + 4096), peak
    assert not list(tmp_path.iterdir()), "swap files must vanish when the tiers close"


def test_partitioned_needs_stage3():
    with pytest.raises(ValueError, match="stage 3"):
        build_partitioned_gpt(TINY, ZeroConfig(stage=2), dp_group=CommGroup.single("dp"), lr=1e-3)
