"""Megatron-LM checkpoints in their own format: a tiny GPT written as Megatron tp (and pp) shards, with Megatron's
names, nesting, args Namespace and QKV layout per checkpoint_version, loads back to the same logits; unsafe pickles,
missing shards and unsupported variants are refused with one clear line."""

from __future__ import annotations

import argparse
import dataclasses
import random
from pathlib import Path

import pytest
import torch

from evals.checkpoint_formats import checkpoint_format, load_checkpoint
from evals.checkpoints import save_consolidated
from evals.cli import main
from evals.megatron_checkpoint import MegatronCheckpointError, read_megatron
from evals.model_builders import gpt_from_state
from evals.repro_lm import ReproCausalLM
from repro.models import GPTConfig, GPTModel, merge_state_dicts, shard_state_dict

def _touch_sentinel(path):
    Path(path).write_text("executed")
    return 0


class Boom:
    """A class a hostile checkpoint could pickle: unpickling it would run ``_touch_sentinel``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (_touch_sentinel, (str(self.path),))


def tiny_model(num_layers: int = 2) -> GPTModel:
    torch.manual_seed(3)
    config = GPTConfig(vocab_size=50257, hidden_size=16, num_layers=num_layers, num_attention_heads=4,
                       max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(config).to(torch.float64).eval()
    with torch.no_grad():
        model.embedding.word_embeddings.weight.mul_(30.0)
    return model


def _qkv_megatron_order(tensor: torch.Tensor, heads: int, version: float) -> torch.Tensor:
    """repro's rows (head, q|k|v, head_dim) -> the order Megatron stores for ``version`` (written independently of
    the reader: version 0 (q|k|v, head, head_dim), 1.0 (head, head_dim, q|k|v), >= 2 unchanged)."""
    rest = tensor.shape[1:]
    grid = tensor.reshape(heads, 3, -1, *rest)
    if version == 0:
        grid = grid.permute(1, 0, 2, *range(3, grid.dim()))
    elif version == 1.0:
        grid = grid.permute(0, 2, 1, *range(3, grid.dim()))
    return grid.reshape(tensor.shape).clone()


def _megatron_model_dict(shard: dict, config: GPTConfig, tp: int, version: float, layers: range,
                         first: bool, last: bool) -> dict:
    body_key, attn = ("transformer", "attention") if version < 3 else ("encoder", "self_attention")
    body = {}
    for local, i in enumerate(layers):
        p, q = f"layers.{i}.", f"layers.{local}."
        names = {"input_layernorm": "input_layernorm", "attention.qkv": f"{attn}.query_key_value",
                 "attention.dense": f"{attn}.dense", "post_attention_layernorm": "post_attention_layernorm",
                 "mlp.fc1": "mlp.dense_h_to_4h", "mlp.fc2": "mlp.dense_4h_to_h"}
        for ours, theirs in names.items():
            for part in ("weight", "bias"):
                tensor = shard[f"{p}{ours}.{part}"]
                if ours == "attention.qkv":
                    tensor = _qkv_megatron_order(tensor, config.num_attention_heads // tp, version)
                body[f"{q}{theirs}.{part}"] = tensor
    if last:
        body["final_layernorm.weight"] = shard["final_layernorm.weight"]
        body["final_layernorm.bias"] = shard["final_layernorm.bias"]
    language_model = {body_key: body}
    words = shard["embedding.word_embeddings.weight"]
    if first:
        language_model["embedding"] = {"word_embeddings": {"weight": words},
                                       "position_embeddings": {"weight": shard["embedding.position_embeddings.weight"]}}
    model = {"language_model": language_model}
    if last and not first:
        model["word_embeddings_for_head"] = {"weight": words}
    return model


def write_megatron(root: Path, model: GPTModel, *, tp: int = 2, pp: int = 1, version: float = 3.0,
                   tracker: str = "release", with_args: bool = True, **extra_args) -> Path:
    """``model`` saved as Megatron-LM would: tracker file, release/ or iter_XXXXXXX/, mp_rank_XX[_YYY] shards."""
    config = model.config
    full = merge_state_dicts([model.state_dict()], config)
    padded = config.padded_vocab_size(tp)
    junk = torch.randn(padded - config.vocab_size, config.hidden_size, dtype=torch.float64) * 5.0
    directory = root / ("release" if tracker == "release" else f"iter_{int(tracker):07d}")
    per_stage = config.num_layers // pp
    for t in range(tp):
        shard = shard_state_dict(full, config, t, tp)
        rows = padded // tp
        words = shard["embedding.word_embeddings.weight"]
        for r in range(rows):  # Megatron's padding rows are not zero
            if t * rows + r >= config.vocab_size:
                words[r] = junk[t * rows + r - config.vocab_size]
        for p in range(pp):
            args = argparse.Namespace(
                num_layers=config.num_layers, hidden_size=config.hidden_size,
                num_attention_heads=config.num_attention_heads, max_position_embeddings=config.max_position_embeddings,
                padded_vocab_size=padded, make_vocab_size_divisible_by=128, tokenizer_type="GPT2BPETokenizer",
                layernorm_epsilon=1e-5, params_dtype=torch.float16, fp16=True, lr=1.5e-4, seq_length=32,
                **({"model_parallel_size": tp} if version < 3 else
                   {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                    "ffn_hidden_size": config.ffn_size, "position_embedding_type": "learned_absolute",
                    "bias_gelu_fusion": True, "openai_gelu": False}),
                **extra_args,
            )
            state = {
                "model": _megatron_model_dict(shard, config, tp, version, range(p * per_stage, (p + 1) * per_stage),
                                              first=p == 0, last=p == pp - 1),
                "checkpoint_version": version, "iteration": 0 if tracker == "release" else int(tracker),
                "optimizer": {"optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}},
                                            "param_groups": [{"lr": 1e-4, "params": [0]}]},
                              "loss_scaler": {"cur_scale": 65536.0}},
                "rng_state": [{"random_rng_state": random.getstate(), "torch_rng_state": torch.get_rng_state()}],
            }
            if with_args:
                state["args"] = args
            name = f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}"
            (directory / name).mkdir(parents=True, exist_ok=True)
            torch.save(state, directory / name / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(tracker + "\n")
    return root


IDS = torch.randint(0, 50257, (2, 32), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("version", [0, 1.0, 3.0])
def test_megatron_tp2_same_logits_as_the_model(tmp_path, version):
    model = tiny_model()
    root = write_megatron(tmp_path / "meg", model, tp=2, version=version,
                          tracker="release" if version else "1000")
    assert checkpoint_format(root) == "megatron"
    loaded = load_checkpoint(root, expect="gpt")
    assert loaded.source == "megatron" and len(loaded.sha256) == 64
    assert loaded.meta["checkpoint_version"] == version and loaded.meta["megatron_tp"] == 2
    assert loaded.config == model.config
    loaded_model = ReproCausalLM(gpt_from_state(loaded, dtype=torch.float64))
    expected = ReproCausalLM(model).full_logits(IDS)
    assert torch.equal(loaded_model.full_logits(IDS), expected)
    # at another tp the shards are repro's own (re-padded) shards of the same consolidated model
    full = merge_state_dicts([model.state_dict()], model.config)
    shard1 = load_checkpoint(root, expect="gpt", tp_rank=1, tp_size=2).state_dict
    assert all(torch.equal(shard1[k], v) for k, v in shard_state_dict(full, model.config, 1, 2).items())
    # the iteration directory itself is accepted too
    direct = read_megatron(root / ("release" if version else "iter_0001000"))
    assert set(direct.state_dict) == set(full)  # consolidated: Megatron's padding rows dropped
    assert all(torch.equal(direct.state_dict[k], v) for k, v in full.items())


def test_megatron_tp2_pp2_stages_renumbered(tmp_path):
    model = tiny_model(num_layers=4)
    root = write_megatron(tmp_path / "meg", model, tp=2, pp=2, version=3.0, tracker="250")
    assert (root / "iter_0000250" / "mp_rank_01_001" / "model_optim_rng.pt").is_file()
    loaded = load_checkpoint(root, expect="gpt")
    assert loaded.meta["megatron_pp"] == 2 and loaded.config.num_layers == 4
    assert torch.equal(ReproCausalLM(gpt_from_state(loaded, dtype=torch.float64)).full_logits(IDS),
                       ReproCausalLM(model).full_logits(IDS))


def test_release_without_args_needs_the_heads(tmp_path):
    model = tiny_model()
    root = write_megatron(tmp_path / "meg", model, tp=2, version=0, with_args=False)
    with pytest.raises(MegatronCheckpointError, match=r"records no args.*num_attention_heads"):
        read_megatron(root)
    loaded = read_megatron(root, overrides={"num_attention_heads": 4})
    assert loaded.config.vocab_size == 50257 and loaded.config.hidden_size == 16  # read off the shapes
    loaded = dataclasses.replace(loaded, state_dict=shard_state_dict(loaded.state_dict, loaded.config, 0, 1))
    model2 = gpt_from_state(loaded, dtype=torch.float64)
    assert torch.equal(ReproCausalLM(model2).full_logits(IDS), ReproCausalLM(model).full_logits(IDS))


def test_gelu_follows_the_training_flags(tmp_path):
    model = tiny_model()
    erf = read_megatron(write_megatron(tmp_path / "a", model, version=0, bias_gelu_fusion=False))
    assert erf.config.gelu_approximate == "none"
    tanh = read_megatron(write_megatron(tmp_path / "b", model, version=0, bias_gelu_fusion=False, openai_gelu=True))
    assert tanh.config.gelu_approximate == "tanh"


def test_non_allow_listed_class_is_refused_without_running_it(tmp_path):
    sentinel = tmp_path / "unpickled"
    root = write_megatron(tmp_path / "meg", tiny_model(), tp=2)
    path = root / "release" / "mp_rank_01" / "model_optim_rng.pt"
    state = torch.load(path, weights_only=False)
    state["optimizer"]["grad_scaler"] = Boom(sentinel)
    torch.save(state, path)
    with pytest.raises(MegatronCheckpointError) as err:
        load_checkpoint(root, expect="gpt")
    message = str(err.value)
    assert "mp_rank_01" in message and "_touch_sentinel" in message and "allow-list" in message
    assert "argparse.Namespace" in message and "\n" not in message
    assert not sentinel.exists()


def test_missing_shard_is_named(tmp_path):
    root = write_megatron(tmp_path / "meg", tiny_model(), tp=2, version=3.0, tracker="7")
    (root / "iter_0000007" / "mp_rank_01" / "model_optim_rng.pt").unlink()
    with pytest.raises(ValueError, match=r"\(tp=2, pp=1\) is missing shard file\(s\) \[.*iter_0000007/mp_rank_01/"
                                         r"model_optim_rng.pt'\]"):
        load_checkpoint(root, expect="gpt")


def test_bad_input_one_clear_sentence(tmp_path):
    model = tiny_model()
    root = write_megatron(tmp_path / "meg", model, tp=2)
    (root / "latest_checkpointed_iteration.txt").write_text("latest")
    with pytest.raises(ValueError, match=r"holds 'latest'; it must be 'release' or an iteration number > 0"):
        read_megatron(root)
    (root / "latest_checkpointed_iteration.txt").write_text("42")
    with pytest.raises(ValueError, match=r"names '42', but .*iter_0000042' does not exist"):
        read_megatron(root)
    swiglu = write_megatron(tmp_path / "swiglu", model, tp=2, swiglu=True)
    with pytest.raises(ValueError, match=r"args.swiglu=True selects SwiGLU MLPs"):
        read_megatron(swiglu)
    with pytest.raises(ValueError, match=r"not a checkpoint directory of a known format.*latest_"):
        load_checkpoint(tmp_path, expect="gpt")
    good = write_megatron(tmp_path / "good", model, tp=2)
    with pytest.raises(ValueError, match=r"holds a GPT model \(no BERT pooler or LM head\), but a BERT"):
        load_checkpoint(good, expect="bert")


def test_cli_evaluates_megatron_like_repro(tmp_path, data_dir, capsys):
    model = tiny_model()
    model32 = tiny_model().to(torch.float32)
    root = write_megatron(tmp_path / "meg", model32, tp=2)
    save_consolidated(tmp_path / "repro", merge_state_dicts([model32.state_dict()], model.config),
                      architecture="gpt", config=model.config)
    from evals.tasks import EvalSpec, run_eval

    meg = run_eval(EvalSpec(task="lambada", checkpoint=str(root), limit=4, progress=False))
    ours = run_eval(EvalSpec(task="lambada", checkpoint=str(tmp_path / "repro"), limit=4, progress=False))
    assert [r["value"] for r in meg] == [r["value"] for r in ours]
    assert meg[0]["model"].startswith("megatron:")
    assert main(["--no-write", "--quiet", "--data-dir", str(data_dir), "lambada", "--checkpoint", str(root),
                 "--limit", "3"]) == 0
    (root / "release" / "mp_rank_01" / "model_optim_rng.pt").unlink()
    capsys.readouterr()
    assert main(["--no-write", "--quiet", "--data-dir", str(data_dir), "lambada", "--checkpoint", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("repro eval: error: Megatron checkpoint") and "mp_rank_01/model_optim_rng.pt" in err
    assert err.count("\n") == 1


def test_cli_device_cuda_without_gpu_is_one_clear_line(tmp_path, capsys):
    root = write_megatron(tmp_path / "meg", tiny_model(), tp=2)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["--no-write", "--quiet", "lambada", "--checkpoint", str(root), "--device", "cuda"]) == 2
    assert capsys.readouterr().err == "repro eval: error: device 'cuda' was asked for, but this machine has no CUDA GPU\n"
    assert main(["--no-write", "--quiet", "lambada", "--checkpoint", str(root), "--device", "gpu"]) == 2
    assert "must be 'cpu', 'cuda' or 'cuda:N'" in capsys.readouterr().err


# -- the paper-scale points of the evaluation experiments ---------------------------------------------------------

def _paper_point(experiment, name: str, **params):
    point = experiment.point_named("paper", name)
    return dataclasses.replace(point, params={**point.params, **params})


def _ctx(tmp_path):
    from repro.experiments.base import RunContext

    return RunContext(scale="paper", rank=0, world_size=1, device="cpu", scratch_dir=tmp_path)


def test_paper_points_without_a_checkpoint_say_what_is_missing(tmp_path, monkeypatch):
    from evals.checkpoint_formats import NeedsCheckpoint
    from repro.experiments import eval_race, eval_wikitext_lambada

    for name in ("REPRO_EVAL_CHECKPOINT", "REPRO_GPT355M", "REPRO_EVAL_BERT_CHECKPOINT", "REPRO_BERT336M"):
        monkeypatch.delenv(name, raising=False)
    cases = ((eval_wikitext_lambada.EXPERIMENT, "gpt-355m", "REPRO_EVAL_CHECKPOINT"),
             (eval_race.EXPERIMENT, "gpt-zeroshot", "REPRO_EVAL_CHECKPOINT"),
             (eval_race.EXPERIMENT, "bert-336m", "REPRO_EVAL_BERT_CHECKPOINT"))
    for experiment, name, variable in cases:
        point = experiment.point_named("paper", name)
        assert point.resources is not None and point.resources.gpus_per_node == 1 and point.needs_gpu
        with pytest.raises(NeedsCheckpoint, match=rf"point '{name}' needs .*: set {variable}=DIR"):
            experiment.run_point(point, _ctx(tmp_path))
    monkeypatch.setenv("REPRO_EVAL_CHECKPOINT", str(tmp_path))
    with pytest.raises(ValueError, match=r"\$REPRO_EVAL_CHECKPOINT='.*' is not a checkpoint directory of a known"):
        eval_wikitext_lambada.EXPERIMENT.run_point(eval_wikitext_lambada.EXPERIMENT.point_named("paper", "gpt-355m"),
                                                   _ctx(tmp_path))


def test_paper_points_evaluate_a_megatron_checkpoint(tmp_path, data_dir, monkeypatch):
    from repro.experiments import eval_race, eval_wikitext_lambada

    model = tiny_model().to(torch.float32)
    root = write_megatron(tmp_path / "meg", model, tp=2, version=0)
    monkeypatch.setenv("REPRO_EVAL_CHECKPOINT", str(root))
    wiki = eval_wikitext_lambada.EXPERIMENT
    point = _paper_point(wiki, "gpt-355m", seq_len=32, stride=16, limit=2, max_tokens=400)
    rows = wiki.run_point(point, _ctx(tmp_path))
    metrics = {(r["metric"], r["definition"]) for r in rows}
    assert {("adjusted_perplexity", "megatron_adjusted"), ("token_perplexity", "megatron_token"),
            ("accuracy", "strict"), ("accuracy", "nonstrict"), ("accuracy", "lm_eval")} <= metrics
    assert all(r["checkpoint_format"] == "megatron" and r["model"].startswith("megatron:") for r in rows)
    assert all(r["metric"] in wiki.metrics for r in rows)
    race = eval_race.EXPERIMENT
    rows = race.run_point(_paper_point(race, "gpt-zeroshot", limit=2), _ctx(tmp_path))
    assert {r["definition"] for r in rows} >= {"lm_eval_zeroshot_middle", "lm_eval_zeroshot_high",
                                                "lm_eval_zeroshot_all"}
    assert all(r["metric"] in race.metrics for r in rows)


def test_megatron_bert_tp2_same_outputs(tmp_path):
    """A Megatron BERT (pre-LN, tokentype embeddings, pooler, LM and binary heads) from 2 tp shards: the same
    sequence and pooled outputs; the RACE finetune path (``load_checkpoint(expect="bert")``) reads it."""
    from evals.model_builders import bert_from_state
    from repro.models import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=16, num_layers=2, num_attention_heads=4,
                        max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0,
                        layernorm_epsilon=1e-5, gelu_approximate="tanh")
    model = BertModel(config).to(torch.float64).eval()
    full = merge_state_dicts([model.state_dict()], config)
    layer_names = {"attention.qkv": "self_attention.query_key_value", "attention.dense": "self_attention.dense",
                   "mlp.fc1": "mlp.dense_h_to_4h", "mlp.fc2": "mlp.dense_4h_to_h"}
    for t in range(2):
        shard = shard_state_dict(full, config, t, 2)
        encoder = {}
        for key, value in shard.items():
            if key.startswith(("layers.", "final_layernorm.")):
                for ours, theirs in layer_names.items():
                    key = key.replace(f".{ours}.", f".{theirs}.")
                encoder[key] = value
        embedding = {name: {"weight": shard[f"embedding.{name}.weight"]}
                     for name in ("word_embeddings", "position_embeddings", "tokentype_embeddings")}
        megatron_model = {
            "language_model": {"embedding": embedding, "encoder": encoder,
                               "pooler": {"dense": {"weight": shard["pooler.weight"], "bias": shard["pooler.bias"]}}},
            "lm_head": {"dense": {"weight": shard["lm_head.dense.weight"], "bias": shard["lm_head.dense.bias"]},
                        "layernorm": {"weight": shard["lm_head.layernorm.weight"],
                                      "bias": shard["lm_head.layernorm.bias"]},
                        "bias": shard["lm_head.bias"]},
            "binary_head": {"weight": shard["binary_head.weight"], "bias": shard["binary_head.bias"]},
        }
        args = argparse.Namespace(num_layers=2, hidden_size=16, num_attention_heads=4, max_position_embeddings=32,
                                  tensor_model_parallel_size=2, pipeline_model_parallel_size=1,
                                  tokenizer_type="BertWordPieceLowerCase", make_vocab_size_divisible_by=128)
        (tmp_path / "release" / f"mp_rank_{t:02d}").mkdir(parents=True)
        torch.save({"model": megatron_model, "args": args, "checkpoint_version": 3.0, "iteration": 0},
                   tmp_path / "release" / f"mp_rank_{t:02d}" / "model_optim_rng.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    loaded = load_checkpoint(tmp_path, expect="bert")
    assert loaded.config == config and loaded.source == "megatron"
    ids = torch.randint(0, 30522, (2, 32), generator=torch.Generator().manual_seed(1))
    types, mask = (torch.arange(32) >= 16).long().expand(2, 32), torch.ones(2, 32, dtype=torch.long)
    with torch.no_grad():
        expected, got = model(ids, types, mask), bert_from_state(loaded, dtype=torch.float64)(ids, types, mask)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    with pytest.raises(ValueError, match="holds a BERT model"):
        load_checkpoint(tmp_path, expect="gpt")
    # repro export-hf tells a Megatron BERT from a GPT by its tensors: MegatronBertForPreTraining, the same weights
    from evals.hf_export import export_hf

    out = tmp_path.parent / f"{tmp_path.name}-hf"  # beside the checkpoint: OUT inside it is refused
    assert export_hf(tmp_path, out) == ("MegatronBertForPreTraining", None)
    back = load_checkpoint(out, expect="bert")
    assert all(torch.equal(back.state_dict[k][: v.shape[0]].double(), v) for k, v in full.items())
