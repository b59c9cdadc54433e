"""Special files where the suite reads a file, and the last settings it took on trust: each refused case beside its
accepted neighbour, exit code 2 and one line naming the value and the rule, before any work, in this process.

* every reader (repro train's DeepSpeed config, --save, --load, its pointer, corpora; the corpus tool's inputs; the
  evaluation data; run files; zero-report's --rows; convert-hf's --hf-dir; --data-dir) refuses a FIFO, a device and a
  symlink loop at once (an alarm turns a reader that blocks into a failure);
* the environment's settings (REPRO_GLOO_CHUNK_BYTES, REPRO_START_METHOD, LOCAL_WORLD_SIZE) are refused before a
  point or a step runs;
* Hugging Face weights that are integers, or not finite, are named with their own file (convert-hf and eval);
  ``repro eval wikitext --max-tokens 1``; garbage in the DeepSpeed config's own tool blocks (aio, flops_profiler,
  comms_logger, comet).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Callable

import pytest
import torch

import repro.training.cli as train_cli
from evals.checkpoints import save_consolidated
from evals.cli import build_parser as eval_parser
from evals.hf_convert import read_safetensors
from evals.hf_export import export_hf
from repro import results as R
from repro.cli import main
from repro.environment import check_environment
from repro.models import GPTConfig, GPTModel
from repro.text.data_files import DataError, verify_sha256
from repro.training.corpus import CorpusError, tokenize_corpus
from repro.zero.deepspeed_json import check_deepspeed_config
from tests.foundation.bad_input_helpers import LAUNCH_VARIABLES, assert_refused, run_in_process


@pytest.fixture(autouse=True)
def no_hang():
    def alarm(signum, frame):
        raise TimeoutError("a reader blocked")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def launch_env(monkeypatch):
    for name in (*LAUNCH_VARIABLES, "REPRO_GLOO_CHUNK_BYTES", "REPRO_START_METHOD"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _special(kind: str) -> Callable[[Path], None]:
    """Make ``path`` a FIFO, a link to /dev/zero, a symlink loop, or a regular file holding ``{}``."""
    def make(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "zero":
            path.symlink_to("/dev/zero")
        elif kind == "loop":
            path.symlink_to(path)
        else:
            path.write_text("{}")
    return make


KIND_WORDS = {"fifo": "is a FIFO", "zero": "is a character device", "loop": "symlink loop"}

#: name -> (repro train options (``{p}`` is the special path), where the special path is, text of the refusal)
TRAIN = {
    "deepspeed_config": (["--deepspeed-config", "{p}"], "ds.json", "--deepspeed-config '{p}'"),
    "save_pointer": (["--save", "{d}/ckpt"], "ckpt/latest_checkpointed_iteration.txt", "latest_checkpointed"),
    "corpus_index": (["--data", "{d}/corpus"], "corpus.idx.json", "--data '{d}/corpus' ('{p}')"),
    "corpus_bin": (["--data", "{d}/corpus"], "corpus.bin", "--data '{d}/corpus' ('{p}')"),
    "valid_corpus_index": (["--valid-data", "{d}/corpus", "--eval-interval", "1"], "corpus.idx.json",
                           "--valid-data '{d}/corpus'"),
    "load_directory": (["--load", "{p}"], "ckpt", "--load '{p}'"),
    "save_directory": (["--save", "{p}"], "ckpt", "--save '{p}'"),
    "tensorboard_directory": (["--tensorboard-dir", "{p}"], "tb", "--tensorboard-dir '{p}'"),
}


@pytest.mark.parametrize("kind", sorted(KIND_WORDS))
@pytest.mark.parametrize("name", sorted(TRAIN))
def test_repro_train_refuses_a_special_file_at_once(name, kind, tmp_path, capsys, launch_env):
    options, where, text = TRAIN[name]
    if kind == "zero" and name.endswith("directory"):
        kind = "fifo"  # a device where a directory belongs: the FIFO case says the same
    path = tmp_path / where
    _special(kind)(path)
    values = {"p": str(path), "d": str(tmp_path)}
    launch_env.setattr(train_cli, "run_fail_fast", lambda *a, **k: pytest.fail(f"{name} {kind} was accepted"))
    argv = ["train", "--steps", "2", "--layers", "2", *(arg.format(**values) for arg in options)]
    code, err = run_in_process(main, argv, capsys)
    assert_refused(argv, code, err, text.format(**values))
    words = KIND_WORDS[kind] if name != "save_pointer" or kind != "zero" else "is a character device"
    assert words in err, err


def test_repro_train_accepts_the_regular_neighbours(tmp_path, capsys, launch_env):
    """The same options with regular files and directories (a symlink to a regular config too) start."""
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "ds.json").symlink_to(tmp_path / "real.json")
    started = []
    launch_env.setattr(train_cli, "run_fail_fast", lambda *a, **k: started.append(1) or 0)
    argv = ["train", "--steps", "2", "--layers", "2", "--deepspeed-config", str(tmp_path / "ds.json"),
            "--save", str(tmp_path / "ckpt"), "--load", str(tmp_path / "ckpt")]
    code, err = run_in_process(main, argv, capsys)
    assert code == 0 and started == [1], err


def _corpus_input(root: Path) -> None:
    tokenize_corpus([root / "input.txt"], root / "out", progress=False)


def _data_file(root: Path) -> None:
    verify_sha256(root / "input.txt", "0" * 64, "a test file")


def _run_file(root: Path) -> None:
    R.read_run(root / "input.txt")


#: other readers, called directly: name -> (reader of root/input.txt, the exception it raises)
READERS: dict[str, tuple[Callable[[Path], None], type[Exception]]] = {
    "corpus_tool_input": (_corpus_input, CorpusError),
    "evaluation_data_file": (_data_file, DataError),
    "run_file": (_run_file, ValueError),
}


@pytest.mark.parametrize("kind", sorted(KIND_WORDS))
@pytest.mark.parametrize("name", sorted(READERS))
def test_every_reader_refuses_a_special_file(name, kind, tmp_path):
    read, error = READERS[name]
    _special(kind)(tmp_path / "input.txt")
    with pytest.raises(error) as refused:
        read(tmp_path)
    line = str(refused.value)
    assert "\n" not in line and "input.txt" in line and KIND_WORDS[kind] in line, line


def test_the_readers_accept_a_regular_file(tmp_path):
    (tmp_path / "input.txt").write_text("")
    assert R.read_run(tmp_path / "input.txt") == []
    with pytest.raises(DataError, match="checksum mismatch"):  # read, then compared
        _data_file(tmp_path)
    with pytest.raises(CorpusError, match="is empty"):  # a regular file, checked for its content
        _corpus_input(tmp_path)


#: command lines of other entry points with a special file: name -> (argv, the special path, text of the refusal)
COMMANDS = {
    "zero_report_rows": (["zero-report", "--rows", "{p}"], "rows.json", "--rows '{p}'"),
    "convert_hf_config": (["eval", "--no-write", "convert-hf", "--hf-dir", "{d}/hf", "--out", "{d}/out"],
                          "hf/config.json", "{d}/hf"),
    "eval_data_dir_loop": (["eval", "--no-write", "--data-dir", "{p}", "lambada", "--checkpoint", "{d}"], "data",
                           "'{p}' (from --data-dir) is a symlink loop"),
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_other_commands_refuse_a_special_file(name, tmp_path, capsys, launch_env):
    argv, where, text = COMMANDS[name]
    kind = "loop" if name.endswith("loop") else "fifo"
    _special(kind)(tmp_path / where)
    values = {"p": str(tmp_path / where), "d": str(tmp_path)}
    argv = [arg.format(**values) for arg in argv]
    assert_refused(argv, *run_in_process(main, argv, capsys), text.format(**values))


@pytest.mark.parametrize("kind", ["fifo", "zero", "regular"])
def test_data_fetch_reads_a_local_mirror_s_regular_files_only(kind, tmp_path, capsys, launch_env):
    """A file:// mirror's file that is a FIFO would block the download, /dev/zero would fill the disk; a regular file
    is read, then checked against its pinned sha256."""
    _special(kind)(tmp_path / "mirror" / "encoder.json")
    argv = ["data", "fetch", "--mirror", str(tmp_path / "mirror"), "--data-dir", str(tmp_path / "data"), "--only",
            "tokenizers"]
    text = "has sha256" if kind == "regular" else f"encoder.json' {KIND_WORDS[kind]}"
    assert_refused(argv, *run_in_process(main, argv, capsys), text)


#: environment -> text of the refusal (None: accepted), checked by repro train before a process group exists
SETTINGS = {
    (("REPRO_GLOO_CHUNK_BYTES", "abc"),): "REPRO_GLOO_CHUNK_BYTES='abc' is not an integer",
    (("REPRO_GLOO_CHUNK_BYTES", "1"),): "REPRO_GLOO_CHUNK_BYTES='1' must be 0 (collectives in one call) or at least",
    (("REPRO_GLOO_CHUNK_BYTES", "-5"),): "REPRO_GLOO_CHUNK_BYTES='-5' must be 0",
    (("REPRO_GLOO_CHUNK_BYTES", "99999999999999999999999"),): "is not an integer",
    (("REPRO_GLOO_CHUNK_BYTES", "0"),): None,
    (("REPRO_GLOO_CHUNK_BYTES", "65536"),): None,
    (("REPRO_START_METHOD", "bogus"),): "REPRO_START_METHOD='bogus' is not one of this platform's start methods",
    (("REPRO_START_METHOD", "spawn"),): None,
    (("LOCAL_WORLD_SIZE", "0"),): "LOCAL_WORLD_SIZE='0' must be an integer >= 1",
    (("LOCAL_WORLD_SIZE", "x"),): "LOCAL_WORLD_SIZE='x' is not an integer",
    (("LOCAL_RANK", "3"), ("LOCAL_WORLD_SIZE", "2")): "the local rank must be below the ranks on this machine",
    (("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")): None,
    (("LOCAL_WORLD_SIZE", "1"),): None,
}


@pytest.mark.parametrize("environment", list(SETTINGS), ids=lambda env: ",".join(f"{k}={v}" for k, v in env))
def test_settings_are_checked_before_any_work(environment, tmp_path, capsys, launch_env):
    for name, value in environment:
        launch_env.setenv(name, value)
    text = SETTINGS[environment]
    started = []
    launch_env.setattr(train_cli, "run_fail_fast", lambda *a, **k: started.append(1) or 0)
    argv = ["train", "--steps", "2", "--layers", "2"]
    code, err = run_in_process(main, argv, capsys)
    if text is None:
        assert code == 0 and started == [1], err
        check_environment()
        return
    assert_refused(argv, code, err, text)
    assert not started


def test_a_bad_start_method_stops_repro_run_before_its_first_point(tmp_path, capsys, launch_env):
    launch_env.setenv("REPRO_START_METHOD", "bogus")
    argv = ["--results-dir", str(tmp_path / "results"), "run", "zero_memory"]
    assert_refused(argv, *run_in_process(main, argv, capsys), "REPRO_START_METHOD='bogus'")
    assert not list((tmp_path / "results").rglob("*.jsonl"))  # no point ran


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50257, hidden_size=16, num_layers=1, num_attention_heads=2,
                       max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0)
    save_consolidated(root / "gpt", GPTModel(config).state_dict(), architecture="gpt", config=config)
    export_hf(root / "gpt", root / "hf")
    return root / "hf"


def _rewrite(directory: Path, change: Callable[[str, torch.Tensor], torch.Tensor]) -> None:
    """model.safetensors rewritten with each tensor changed (int64 is written as safetensors' I64)."""
    tensors = {name: change(name, tensor) for name, tensor in read_safetensors(directory / "model.safetensors").items()}
    header, offset, blobs = {}, 0, []
    names = {torch.float32: "F32", torch.int64: "I64", torch.float16: "F16"}
    for name, tensor in tensors.items():
        data = tensor.contiguous().numpy().tobytes()
        header[name] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    raw = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))


QKV = "transformer.h.0.attn.c_attn.weight"
#: name -> (how each tensor changes, text of the refusal; None: accepted)
HF_WEIGHTS = {
    "int64_weights": (lambda name, t: (t * 100).long(), "has dtype int64; a model's weights are floating point"),
    "nan_weights": (lambda name, t: t.fill_(float("nan")) if name == QKV else t,
                    f"model.safetensors': tensor {QKV!r} holds non-finite values"),
    "fp16_weights": (lambda name, t: t.half(), None),  # HF checkpoints in half precision are common
}


@pytest.mark.parametrize("command", ["convert-hf", "lambada"])
@pytest.mark.parametrize("name", sorted(HF_WEIGHTS))
def test_hf_weights_are_named_with_their_own_file(name, command, hf_dir, tmp_path, capsys, launch_env, data_dir):
    import shutil

    root = tmp_path / "hf"
    shutil.copytree(hf_dir, root)
    change, text = HF_WEIGHTS[name]
    _rewrite(root, change)
    argv = (["eval", "--no-write", "convert-hf", "--hf-dir", str(root), "--out", str(tmp_path / "out")]
            if command == "convert-hf" else
            ["eval", "--no-write", "--quiet", "--data-dir", str(data_dir), "lambada", "--checkpoint", str(root),
             "--limit", "1"])
    code, err = run_in_process(main, argv, capsys)
    if text is None:
        assert code == 0, err
        return
    assert_refused(argv, code, err, text)
    assert "model.safetensors" in err and "config.json" not in err, err


def test_wikitext_max_tokens_needs_two(launch_env):
    parser = eval_parser()
    assert parser.parse_args(["wikitext", "--checkpoint", "c", "--max-tokens", "2"]).max_tokens == 2
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["wikitext", "--checkpoint", "c", "--max-tokens", "1"])
    assert refused.value.code == 2


#: DeepSpeed's own tool blocks: name -> (config, text of the refusal; None: accepted)
DS_BLOCKS = {
    "aio_garbage_value": ({"aio": {"block_size": "garbage"}}, "aio.block_size='garbage'"),
    "aio_unknown_key": ({"aio": {"blok_size": 1048576}}, "unknown aio keys ['blok_size'] (did you mean 'block_size'"),
    "aio_negative_depth": ({"aio": {"queue_depth": -8}}, "aio.queue_depth=-8"),
    "aio_as_documented": ({"aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1,
                                   "single_submit": False, "overlap_events": True}}, None),
    "flops_profiler_text_flag": ({"flops_profiler": {"enabled": "yes"}}, "flops_profiler.enabled='yes'"),
    "flops_profiler_as_documented": ({"flops_profiler": {"enabled": False, "profile_step": 1, "module_depth": -1,
                                                         "top_modules": 1, "detailed": True, "output_file": None}},
                                     None),
    "comms_logger_ops_text": ({"comms_logger": {"prof_ops": "all_reduce"}}, "comms_logger.prof_ops='all_reduce'"),
    "comms_logger_as_documented": ({"comms_logger": {"enabled": True, "verbose": False, "prof_all": True,
                                                     "debug": False}}, None),
    "comet_unknown_key": ({"comet": {"enabled": False, "projct": "x"}}, "unknown comet keys ['projct']"),
}


@pytest.mark.parametrize("name", sorted(DS_BLOCKS))
def test_deepspeed_tool_blocks_are_checked_key_by_key(name):
    config, text = DS_BLOCKS[name]
    if text is None:
        check_deepspeed_config(config)
        return
    with pytest.raises(ValueError) as refused:
        check_deepspeed_config(config)
    assert "\n" not in str(refused.value) and text in str(refused.value), str(refused.value)
