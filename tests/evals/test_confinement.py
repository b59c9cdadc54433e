"""Every format the suite reads reads only regular files inside the directory it was given: repro train's checkpoints
(read by ``repro train --load`` and by the evaluation harness and export), the harness's own, Hugging Face's and
Megatron-LM's, and a DeepSpeed config. For each format, a table of ways out (a symlink leaving the directory, a
``..`` or absolute name in a manifest, header or index map, with the right size and sha256 where one is kept) and
of special files (a FIFO, a device, a symlink loop), each refused in one line naming the entry, beside the accepted
neighbour (a symlink that stays inside). All in this process: the checkpoints are made once per module."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Callable

import pytest
import torch

from evals.checkpoint_formats import load_checkpoint
from evals.checkpoints import HEADER, save_consolidated
from evals.hf_export import export_hf
from repro.dist import init_parallel
from repro.models import GPTConfig, GPTModel
from repro.training.argcheck import read_deepspeed_config
from repro.training.checkpoint import load_training_checkpoint, save_training_checkpoint
from repro.training.data import SyntheticSamples
from repro.training.trainer import PipelineTrainer, TrainSettings
from tests.evals.test_evals_megatron_checkpoint import tiny_model, write_megatron

#: reads no data through datasets or lm_eval: runs without them (tests/evals/conftest.py), not again in
#: test_evals_without_datasets.py
pytestmark = pytest.mark.datasets_free

CONFIG = GPTConfig(vocab_size=64, hidden_size=32, num_layers=2, num_attention_heads=4, max_position_embeddings=16)
ITER = "iter_0000001"


@pytest.fixture(autouse=True)
def no_hang():
    """Fail, instead of hanging, if a reader blocks on a FIFO for 30 s."""
    def alarm(signum, frame):
        raise TimeoutError("a reader blocked")
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _trainer() -> PipelineTrainer:
    return PipelineTrainer(CONFIG, init_parallel(), TrainSettings(steps=2, micro_batches=2, micro_batch_size=2,
                                                                  seq_len=16))


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """One valid directory per format, made once: repro train's (one step), the harness's, HF's, Megatron-LM's."""
    root = tmp_path_factory.mktemp("sources")
    trainer = _trainer()
    trainer.step(SyntheticSamples(vocab_size=64, seq_len=16, seed=0).batch(0, 4))
    save_training_checkpoint(root / "trained", trainer)
    torch.manual_seed(0)
    gpt = GPTConfig(vocab_size=50257, hidden_size=16, num_layers=1, num_attention_heads=2, max_position_embeddings=64,
                    hidden_dropout=0.0, attention_dropout=0.0)
    save_consolidated(root / "repro", GPTModel(gpt).state_dict(), architecture="gpt", config=gpt)
    export_hf(root / "repro", root / "hf")
    write_megatron(root / "megatron", tiny_model(1), tp=1, tracker="10")
    return {"trained": root / "trained", "repro": root / "repro", "hf": root / "hf", "megatron": root / "megatron"}


def _outside(root: Path, relpath: str) -> Path:
    """A true copy of ``root/relpath`` outside ``root`` (same bytes, so the same size and sha256)."""
    copy = root.parent / f"outside-{relpath.replace('/', '_')}"
    shutil.copyfile(root / relpath, copy)
    return copy


def _link_out(relpath: str) -> Callable[[Path], None]:
    """``relpath`` replaced by a symlink to its true copy outside the directory."""
    def apply(root: Path) -> None:
        copy = _outside(root, relpath)
        (root / relpath).unlink()
        (root / relpath).symlink_to(copy)
    return apply


def _link_inside(relpath: str) -> Callable[[Path], None]:
    """``relpath`` moved into a subfolder of the directory and replaced by a symlink to it (stays inside)."""
    def apply(root: Path) -> None:
        (root / "kept").mkdir(exist_ok=True)
        target = root / "kept" / relpath.replace("/", "_")
        (root / relpath).rename(target)
        (root / relpath).symlink_to(target)
    return apply


def _dir_out(relpath: str) -> Callable[[Path], None]:
    """The folder ``relpath`` moved outside the directory, a symlink left in its place."""
    def apply(root: Path) -> None:
        target = root.parent / f"moved-{relpath.replace('/', '_')}"
        (root / relpath).rename(target)
        (root / relpath).symlink_to(target, target_is_directory=True)
    return apply


def _special(relpath: str, kind: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / relpath).unlink()
        if kind == "fifo":
            os.mkfifo(root / relpath)
        elif kind == "loop":
            (root / relpath).symlink_to(root / relpath)
        else:
            (root / relpath).symlink_to("/dev/zero")
    return apply


def _manifest_entry(name_of: Callable[[Path], str]) -> Callable[[Path], None]:
    """rank00000.pt listed under another name (outside, with its true size and sha256), the file itself removed."""
    def apply(root: Path) -> None:
        iteration = root / ITER
        copy = _outside(iteration, "rank00000.pt")
        manifest = json.loads((iteration / "manifest.json").read_text())
        entry = manifest["files"].pop("rank00000.pt")
        manifest["files"][name_of(copy)] = entry
        (iteration / "manifest.json").write_text(json.dumps(manifest))
        (iteration / "rank00000.pt").unlink()
    return apply


def _header_files(names: list[str]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        _outside(root, "model.pt")
        header = json.loads((root / HEADER).read_text())
        header["files"] = names
        (root / HEADER).write_text(json.dumps(header))
    return apply


def _hf_index(name: str) -> Callable[[Path], None]:
    """model.safetensors named by an index map entry ``name`` (its true copy outside when the name leaves)."""
    def apply(root: Path) -> None:
        _outside(root, "model.safetensors")
        shutil.copyfile(root / "model.safetensors", root / "inner.safetensors")
        (root / "model.safetensors").unlink()
        tensors = json.loads(_safetensors_header(root / "inner.safetensors"))
        weight_map = {key: name for key in tensors if key != "__metadata__"}
        (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return apply


def _safetensors_header(path: Path) -> bytes:
    data = path.read_bytes()
    return data[8: 8 + int.from_bytes(data[:8], "little")]


def _hub_snapshot(root: Path) -> None:
    """The directory laid out as the hub's cache: models--x/snapshots/rev/<file> -> ../../blobs/<sha>."""
    model = root / "models--org--name"
    (model / "blobs").mkdir(parents=True)
    snapshot = model / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    for path in list(root.iterdir()):
        if path.is_file():
            blob = model / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
            path.rename(blob)
            (snapshot / path.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)


#: name -> (format, how the directory is changed, where the reader starts (relative), words of the refusal or None)
CASES: dict[str, tuple[str, Callable[[Path], None], str, str | None]] = {
    # repro train's checkpoint (read by repro train --load, the harness and export-hf)
    "trained_rank_file_links_out": ("trained", _link_out(f"{ITER}/rank00000.pt"), "", "rank00000.pt"),
    "trained_iteration_links_out": ("trained", _dir_out(ITER), "", ITER),
    "trained_trainer_json_links_out": ("trained", _link_out(f"{ITER}/trainer.json"), "", "trainer.json"),
    "trained_manifest_links_out": ("trained", _link_out(f"{ITER}/manifest.json"), "", "manifest.json"),
    "trained_pointer_links_out": ("trained", _link_out("latest_checkpointed_iteration.txt"), "",
                                  "latest_checkpointed_iteration.txt"),
    "trained_manifest_dotdot": ("trained", _manifest_entry(lambda copy: f"../{copy.name}"), "", "'..'"),
    "trained_manifest_absolute": ("trained", _manifest_entry(lambda copy: str(copy)), "", "an absolute path"),
    "trained_pointer_fifo": ("trained", _special("latest_checkpointed_iteration.txt", "fifo"), "", "is a FIFO"),
    "trained_pointer_loop": ("trained", _special("latest_checkpointed_iteration.txt", "loop"), "",
                             "symlink loop"),
    "trained_pointer_dev_zero": ("trained", _special("latest_checkpointed_iteration.txt", "zero"), "",
                                 "latest_checkpointed_iteration.txt"),
    "trained_trainer_json_fifo": ("trained", _special(f"{ITER}/trainer.json", "fifo"), "", "is a FIFO"),
    "trained_manifest_dev_zero": ("trained", _special(f"{ITER}/manifest.json", "zero"), "", "manifest.json"),
    "trained_rank_file_fifo": ("trained", _special(f"{ITER}/rank00000.pt", "fifo"), "", "is a FIFO"),
    "trained_rank_file_links_inside": ("trained", _link_inside(f"{ITER}/rank00000.pt"), "", None),
    "trained_iteration_dir_given": ("trained", lambda root: None, ITER, None),
    # the evaluation harness's own checkpoint
    "repro_header_dotdot": ("repro", _header_files(["../outside-model.pt"]), "", "'..'"),
    "repro_header_absolute": ("repro", lambda root: _header_files([str(_outside(root, "model.pt"))])(root), "",
                              "an absolute path"),
    "repro_weights_link_out": ("repro", _link_out("model.pt"), "", "model.pt"),
    "repro_header_links_out": ("repro", _link_out(HEADER), "", HEADER),
    "repro_weights_fifo": ("repro", _special("model.pt", "fifo"), "", "is a FIFO"),
    "repro_header_dev_zero": ("repro", _special(HEADER, "zero"), "", HEADER),
    "repro_weights_link_inside": ("repro", _link_inside("model.pt"), "", None),
    # Hugging Face
    "hf_config_links_out": ("hf", _link_out("config.json"), "", "config.json"),
    "hf_weights_link_out": ("hf", _link_out("model.safetensors"), "", "model.safetensors"),
    "hf_index_dotdot": ("hf", _hf_index("../outside-model.safetensors"), "", "'..'"),
    "hf_index_absolute": ("hf", lambda root: _hf_index(str(root.parent / "outside-model.safetensors"))(root), "",
                          "an absolute path"),
    "hf_config_fifo": ("hf", _special("config.json", "fifo"), "", "is a FIFO"),
    "hf_weights_dev_zero": ("hf", _special("model.safetensors", "zero"), "", "model.safetensors"),
    "hf_index_inside": ("hf", _hf_index("inner.safetensors"), "", None),
    "hf_hub_snapshot": ("hf", _hub_snapshot, "models--org--name/snapshots/rev", None),
    # Megatron-LM
    "megatron_iteration_links_out": ("megatron", _dir_out("iter_0000010"), "", "iter_0000010"),
    "megatron_rank_dir_links_out": ("megatron", _dir_out("iter_0000010/mp_rank_00"), "", "mp_rank_00"),
    "megatron_shard_links_out": ("megatron", _link_out("iter_0000010/mp_rank_00/model_optim_rng.pt"), "",
                                 "model_optim_rng.pt"),
    "megatron_tracker_links_out": ("megatron", _link_out("latest_checkpointed_iteration.txt"), "",
                                   "latest_checkpointed_iteration.txt"),
    "megatron_tracker_fifo": ("megatron", _special("latest_checkpointed_iteration.txt", "fifo"), "", "is a FIFO"),
    "megatron_shard_dev_zero": ("megatron", _special("iter_0000010/mp_rank_00/model_optim_rng.pt", "zero"), "",
                                "model_optim_rng.pt"),
    "megatron_shard_links_inside": ("megatron", _link_inside("iter_0000010/mp_rank_00/model_optim_rng.pt"), "",
                                    None),
}


def _copy(sources: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    root = tmp_path / "given"
    shutil.copytree(sources[kind], root, symlinks=True)
    return root


def _assert_one_line(err: BaseException, words: str) -> None:
    line = str(err)
    assert "\n" not in line and "Traceback" not in line, line
    assert words in line, f"{line!r} does not name {words!r}"
    assert "leaves the directory" in line or "is a" in line or "symlink" in line, line


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_checkpoint_reads_only_regular_files_inside_it(name, sources, tmp_path):
    kind, change, start, words = CASES[name]
    root = _copy(sources, kind, tmp_path)
    change(root)
    given = root / start if start else root
    readers = [lambda: load_checkpoint(given, expect="gpt")]
    if kind == "trained":  # repro train --load reads it too
        readers.append(lambda: load_training_checkpoint(given, _trainer()))
    for read in readers:
        if words is None:
            assert read() is not None
            continue
        with pytest.raises(ValueError) as refused:
            read()
        _assert_one_line(refused.value, words)


#: DeepSpeed config: a file, so its rule is a regular file of at most the config cap
DS_CASES: dict[str, tuple[Callable[[Path], Path], str | None]] = {
    "fifo": (lambda root: (os.mkfifo(root / "ds.json"), root / "ds.json")[1], "is a FIFO"),
    "dev_zero": (lambda root: Path("/dev/zero"), "is a character device"),
    "symlink_loop": (lambda root: ((root / "ds.json").symlink_to(root / "ds.json"), root / "ds.json")[1],
                     "symlink loop"),
    "oversized": (lambda root: ((root / "ds.json").write_bytes(b" " * (64 << 20) + b"{}"), root / "ds.json")[1],
                  "bytes; a file of this kind holds at most"),
    "symlink_to_a_config": (lambda root: ((root / "real.json").write_text('{"zero_optimization": {"stage": 1}}'),
                                          (root / "ds.json").symlink_to(root / "real.json"), root / "ds.json")[2],
                            None),
}


@pytest.mark.parametrize("name", sorted(DS_CASES))
def test_a_deepspeed_config_is_a_regular_file_of_a_config_s_size(name, tmp_path):
    make, words = DS_CASES[name]
    path = make(tmp_path)
    if words is None:
        zero, _, _ = read_deepspeed_config(str(path))
        assert zero.stage == 1
        return
    with pytest.raises(ValueError) as refused:
        read_deepspeed_config(str(path))
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"--deepspeed-config {str(path)!r}") and words in line, line


def _nan_megatron(root: Path) -> None:
    path = root / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt"
    state = torch.load(path, weights_only=False)  # the test's own file (it pickles argparse.Namespace)
    encoder = state["model"]["language_model"]
    layers = encoder.get("encoder") or encoder.get("transformer")
    next(iter(layers.values())).fill_(float("nan"))
    torch.save(state, path)


def _nan_trained(root: Path) -> None:
    path = root / ITER / "rank00000.pt"
    payload = torch.load(path, weights_only=True)
    next(iter(payload["extra"]["model"].values())).fill_(float("nan"))
    torch.save(payload, path)
    manifest = json.loads((root / ITER / "manifest.json").read_text())
    data = path.read_bytes()
    manifest["files"]["rank00000.pt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (root / ITER / "manifest.json").write_text(json.dumps(manifest))


#: weights that are not finite are named with their own file: name -> (format, change, file named)
NAN_CASES = {"megatron": (_nan_megatron, "model_optim_rng.pt'"), "trained": (_nan_trained, "rank00000.pt")}


@pytest.mark.parametrize("kind", sorted(NAN_CASES))
def test_non_finite_weights_are_named_with_their_own_file(kind, sources, tmp_path):
    change, named = NAN_CASES[kind]
    root = _copy(sources, kind, tmp_path)
    change(root)
    with pytest.raises(ValueError) as refused:
        load_checkpoint(root, expect="gpt")
    line = str(refused.value)
    assert "\n" not in line and named in line and "holds non-finite values" in line, line
