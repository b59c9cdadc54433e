"""Training a tiny GPT for 20 steps from one seed at tp=1 and tp=2 (dropout 0) gives the same losses (<= 1e-4)."""

from repro.dist import init_parallel, spawn
from repro.models import GPTConfig
from repro.training import train_gpt

CONFIG = GPTConfig(vocab_size=96, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16,
                   hidden_dropout=0.0, attention_dropout=0.0)
SETTINGS = dict(micro_batch_size=4, seq_len=16, lr=3e-3, seed=7)


def _train(rank, world_size):
    return train_gpt(CONFIG, init_parallel(tp=world_size), 20, 1, **SETTINGS)


def test_tp1_and_tp2_losses_agree():
    tp1 = spawn(_train, 1)[0]
    tp2 = spawn(_train, 2)
    assert tp2[0] == tp2[1]  # every rank reports the same loss
    assert tp1[-1] < tp1[0]  # it learns
    worst = max(abs(a - b) for a, b in zip(tp1, tp2[0]))
    assert worst <= 1e-4, f"max |loss(tp=1) - loss(tp=2)| = {worst:.2e}"
