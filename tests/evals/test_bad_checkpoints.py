"""Checkpoints are untrusted input: every broken one the evaluation harness or ``repro export-hf`` reads is refused
before any work with exit code 2 and one line naming the file and what is wrong (was: tracebacks of KeyError,
TypeError, UnpicklingError or state-dict RuntimeErrors, messages without the file, weights read from outside the
checkpoint, an export written into its own checkpoint, nan perplexities).

One table: how to break a copy of a valid checkpoint (repro's own, Hugging Face's, ``repro train``'s, Megatron-LM's),
the command that reads it, and a piece of the one line. The valid neighbours still evaluate and export. Every case
runs the entry point in this process; the ``repro train`` checkpoint is made once by a real process.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

from evals.checkpoints import save_consolidated
from evals.cli import main as eval_main
from evals.hf_export import main as export_main
from repro.models import GPTConfig, GPTModel
from repro.testing import needs
from tests.foundation.bad_input_helpers import assert_refused, run_in_process

SENTINEL = "PWNED-by-a-checkpoint"


class _Exec:
    """A pickle that would run a shell command when unpickled without ``weights_only``."""

    def __reduce__(self):
        return (os.system, (f"touch {SENTINEL}",))


def _edit_json(relpath: str, edit: Callable[[object], object]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / relpath
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return apply


def _set(key_path: tuple, value) -> Callable[[object], object]:
    def edit(h):
        target = h
        for key in key_path[:-1]:
            target = target[key]
        target[key_path[-1]] = value
        return h
    return edit


def _delete(key: str) -> Callable[[object], object]:
    def edit(h):
        del h[key]
        return h
    return edit


def _write(relpath: str, data: bytes) -> Callable[[Path], None]:
    return lambda root: (root / relpath).write_bytes(data)


def _edit_state(relpath: str, edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        state = torch.load(root / relpath, weights_only=True)
        torch.save(edit(state), root / relpath)
    return apply


def _pop(name: str) -> Callable[[dict], dict]:
    return lambda s: {k: v for k, v in s.items() if k != name}


def _half(relpath: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = (root / relpath).read_bytes()
        (root / relpath).write_bytes(data[: len(data) // 2])
    return apply


def _exec_pickle(relpath: str, manifest: str | None = None) -> Callable[[Path], None]:
    """Replace a weights file by a code-running pickle (and fix its size and sha256 in a repro train manifest)."""
    def apply(root: Path) -> None:
        torch.save({"a": _Exec()}, root / relpath)
        if manifest is not None:
            entry_name = Path(relpath).name
            data = (root / relpath).read_bytes()
            content = json.loads((root / manifest).read_text())
            content["files"][entry_name].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
            (root / manifest).write_text(json.dumps(content))
    return apply


def _remove(relpath: str) -> Callable[[Path], None]:
    return lambda root: (root / relpath).unlink()


def _both(*steps: Callable[[Path], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        for step in steps:
            step(root)
    return apply


H = "repro_checkpoint.json"
TRAINER = "iter_0000002/trainer.json"
#: name: (source checkpoint, how it is broken, a piece of the one line)
CASES: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # 1: the header's keys and types
    "header_no_architecture": ("repro", _edit_json(H, _delete("architecture")), "lacks the key 'architecture'"),
    "header_no_config": ("repro", _edit_json(H, _delete("config")), "lacks the key 'config'"),
    "header_no_files": ("repro", _edit_json(H, _delete("files")), "lacks the key 'files'"),
    "header_no_tp_size": ("repro", _edit_json(H, _delete("tp_size")), "lacks the key 'tp_size'"),
    "header_a_list": ("repro", _edit_json(H, lambda h: [1, 2]), "holds a JSON list, not an object"),
    "header_architecture_list": ("repro", _edit_json(H, _set(("architecture",), ["gpt"])), "architecture=['gpt']"),
    "header_unknown_config_key": ("repro", _edit_json(H, _set(("config", "bogus"), 1)), "['bogus']"),
    "header_config_type": ("repro", _edit_json(H, _set(("config", "hidden_size"), "16")), "hidden_size='16'"),
    # 2: weights files that are not weights
    "weights_random": ("repro", _write("model.pt", os.urandom(1000)), "model.pt' is not a PyTorch weights file"),
    "weights_empty": ("repro", _write("model.pt", b""), "model.pt' is not a PyTorch weights file"),
    "weights_half": ("repro", _half("model.pt"), "model.pt' is not a PyTorch weights file"),
    "weights_a_list": ("repro", _edit_state("model.pt", lambda s: list(s.values())), "holds a list, not a dict"),
    "weights_a_tensor": ("repro", _edit_state("model.pt", lambda s: torch.zeros(2)), "holds a Tensor, not a dict"),
    "weights_exec_pickle": ("repro", _exec_pickle("model.pt"), "it pickles posix.system"),
    # 3: tensors that are not the config's
    "config_hidden_size": ("repro", _edit_json(H, _set(("config", "hidden_size"), 32)), "does not match its config"),
    "config_num_layers": ("repro", _edit_json(H, _set(("config", "num_layers"), 2)),
                          "'layers.1.input_layernorm.weight' is missing"),
    "tensor_popped": ("repro", _edit_state("model.pt", _pop("layers.0.mlp.fc1.bias")),
                      "'layers.0.mlp.fc1.bias' is missing"),
    "tensor_added": ("repro", _edit_state("model.pt", lambda s: {**s, "extra.weight": torch.zeros(2)}),
                     "'extra.weight' is unexpected"),
    "tensor_reshaped": ("repro", _edit_state("model.pt", lambda s: {**s, "final_layernorm.weight": torch.zeros(3)}),
                        "'final_layernorm.weight' has shape (3,)"),
    # 4: JSON that is not JSON
    "header_not_json": ("repro", _write(H, b"{x"), f"{H}' is not valid JSON"),
    "header_empty": ("repro", _write(H, b""), f"{H}' is empty"),
    "header_not_utf8": ("repro", _write(H, b'{"format":"\xff"}'), f"{H}' is not UTF-8"),
    "hf_config_not_json": ("hf", _write("config.json", b"{x"), "config.json' is not valid JSON"),
    "hf_index_not_json": ("hf", _write("model.safetensors.index.json", b"{x"), "index.json' is not valid JSON"),
    # 5, 6: the files a header or an index names
    "files_a_string": ("repro", _edit_json(H, _set(("files",), "model.pt")), "must be a non-empty list of file"),
    "files_empty": ("repro", _edit_json(H, _set(("files",), [])), "must be a non-empty list of file names"),
    "files_outside": ("repro", _edit_json(H, _set(("files",), ["../other/model.pt"])), "leaves the directory"),
    "hf_index_outside": ("hf", _both(_write("model.safetensors.index.json",
                                            b'{"weight_map":{"a":"../../hf/model.safetensors"}}'),
                                     _remove("model.safetensors")), "leaves the directory"),
    # 7: a Hugging Face config.json or index that does not fit
    "hf_config_a_list": ("hf", _edit_json("config.json", lambda h: []), "config.json' holds a JSON list"),
    "hf_config_no_n_layer": ("hf", _edit_json("config.json", _delete("n_layer")), "lacks the key 'n_layer'"),
    "hf_config_n_layer": ("hf", _edit_json("config.json", _set(("n_layer",), 2)), "'transformer.h.1.ln_1.weight'"),
    "hf_config_n_embd": ("hf", _edit_json("config.json", _set(("n_embd",), 32)), "config.json': the checkpoint "
                         "does not match its config"),
    "hf_index_empty_object": ("hf", _write("model.safetensors.index.json", b"{}"), "has no weight_map"),
    # 8: repro train's checkpoint
    "trained_unknown_model_key": ("trained", _edit_json(TRAINER, _set(("model", "bogus"), 1)),
                                  "corrupt checkpoint"),
    "trained_hidden_size": ("trained", _edit_json(TRAINER, _set(("model", "hidden_size"), 32)),
                            "corrupt checkpoint"),
    "trained_tp": ("trained", _edit_json(TRAINER, _set(("tp",), 2)), "lists no rank00001.pt"),
    "trained_exec_pickle": ("trained", _exec_pickle("iter_0000002/rank00000.pt", "iter_0000002/manifest.json"),
                            "it pickles posix.system"),
    # 9: Megatron-LM's shard of garbage: one short line
    "megatron_garbage": ("megatron", lambda root: None, "model_optim_rng.pt' is not a PyTorch weights file"),
    # 22: weights that are not finite
    "weights_nan": ("repro", _edit_state("model.pt", lambda s: {k: v * float("nan") for k, v in s.items()}),
                    "holds non-finite values"),
}
#: cases also read by ``repro export-hf`` (the same loaders)
EXPORT_CASES = ("header_no_architecture", "weights_exec_pickle", "weights_random", "hf_config_no_n_layer",
                "trained_unknown_model_key")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """One valid checkpoint per format (a 1-layer GPT with GPT-2's vocabulary), made once."""
    root = tmp_path_factory.mktemp("sources")
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50257, hidden_size=16, num_layers=1, num_attention_heads=2,
                       max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0)
    save_consolidated(root / "gpt", GPTModel(config).state_dict(), architecture="gpt", config=config)
    assert export_main([str(root / "gpt"), str(root / "hf")]) == 0
    megatron = root / "megatron" / "release" / "mp_rank_00"
    megatron.mkdir(parents=True)
    (root / "megatron" / "latest_checkpointed_iteration.txt").write_text("release\n")
    (megatron / "model_optim_rng.pt").write_bytes(bytes(range(256)) * 2)
    return {"repro": root / "gpt", "hf": root / "hf", "megatron": root / "megatron"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A 2-step checkpoint of ``repro train`` (a real process, bounded)."""
    save = tmp_path_factory.mktemp("trained") / "s1"
    proc = subprocess.run([sys.executable, "-m", "repro", "train", "--steps", "2", "--save", str(save),
                           "--save-interval", "2", "--hidden", "16", "--vocab", "50257", "--seq-len", "16"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return save


def _copy(case: str, sources: dict[str, Path], request, tmp_path: Path) -> Path:
    kind, brake, _ = CASES[case]
    source = request.getfixturevalue("trained") if kind == "trained" else sources[kind]
    broken = tmp_path / "gpt"
    shutil.copytree(source, broken)
    brake(broken)
    return broken


def _eval_argv(data_dir: Path, checkpoint: Path) -> list[str]:
    return ["--no-write", "--quiet", "--threads", "1", "--data-dir", str(data_dir), "lambada", "--checkpoint",
            str(checkpoint), "--limit", "2"]


@needs("datasets", "tokenizers")
@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_checkpoint_is_one_line(case, sources, request, tmp_path, data_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    broken = _copy(case, sources, request, tmp_path)
    argv = _eval_argv(data_dir, broken)
    code, err = run_in_process(eval_main, argv, capsys)
    assert_refused(argv, code, err, CASES[case][2])
    assert len(err) < 400, err
    assert not (tmp_path / SENTINEL).exists()


@pytest.mark.parametrize("case", EXPORT_CASES)
def test_export_hf_refuses_the_same(case, sources, request, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    broken = _copy(case, sources, request, tmp_path)
    argv = [str(broken), str(tmp_path / "out")]
    code, err = run_in_process(export_main, argv, capsys)
    assert_refused(argv, code, err, CASES[case][2])
    assert not (tmp_path / "out").exists() and not (tmp_path / SENTINEL).exists()


@needs("datasets", "tokenizers")
@pytest.mark.parametrize("kind", ["repro", "hf", "trained"])
def test_valid_neighbours_still_evaluate(kind, sources, request, data_dir, capsys):
    source = request.getfixturevalue("trained") if kind == "trained" else sources[kind]
    assert eval_main(_eval_argv(data_dir, source)) == 0
    assert "accuracy" in capsys.readouterr().out


def _export_argv(tmp_path: Path) -> dict[str, list[str]]:
    ckpt = str(tmp_path / "same")
    return {
        "out_is_the_checkpoint": ([ckpt, ckpt], f"OUT {ckpt!r} is the checkpoint directory"),
        "out_inside_the_checkpoint": ([ckpt, f"{ckpt}/hf"], "is inside the checkpoint directory"),
        "checkpoint_inside_out": ([ckpt, str(tmp_path)], "holds the checkpoint directory"),
        "out_empty": ([ckpt, ""], "OUT '' is empty: give a directory"),
        "checkpoint_empty": (["", str(tmp_path / "o")], "CHECKPOINT '' is empty"),
    }


@pytest.mark.parametrize("case", ["out_is_the_checkpoint", "out_inside_the_checkpoint", "checkpoint_inside_out",
                                  "out_empty", "checkpoint_empty"])
def test_export_hf_out_is_refused(case, sources, tmp_path, capsys):
    shutil.copytree(sources["repro"], tmp_path / "same")
    argv, text = _export_argv(tmp_path)[case]
    code, err = run_in_process(export_main, argv, capsys)
    assert_refused(argv, code, err, text)
    assert sorted(p.name for p in (tmp_path / "same").iterdir()) == ["model.pt", H]


@pytest.mark.parametrize("value", ["afile.txt", "/nonexistent"])
def test_export_hf_refuses_a_bad_repro_data(value, sources, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile.txt").write_text("x\n")
    monkeypatch.setenv("REPRO_DATA", value)
    argv = [str(sources["repro"]), str(tmp_path / "o")]
    code, err = run_in_process(export_main, argv, capsys)
    assert_refused(argv, code, err, f"REPRO_DATA={value}")
    assert not (tmp_path / "o").exists()


def test_export_hf_valid_neighbours(sources, tmp_path, capsys, monkeypatch):
    """A fresh OUT beside the checkpoint exports; without $REPRO_DATA the weights alone are written."""
    monkeypatch.delenv("REPRO_DATA", raising=False)
    assert export_main([str(sources["repro"]), str(tmp_path / "beside")]) == 0
    assert (tmp_path / "beside" / "model.safetensors").read_bytes() == (
        sources["hf"] / "model.safetensors").read_bytes()
