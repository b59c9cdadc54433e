"""What ``repro train`` checks on every rank before it starts a process group or takes a step.

A bad value found at step 1,000 costs the hours before it; one found by an allocator or a ``timedelta`` is a
traceback. So before anything runs, each rank checks, and refuses in one line naming the value and the rule:

* the launch variables (RANK, WORLD_SIZE, LOCAL_RANK, their Slurm twins) are whole numbers in range, and the world
  divides into tp x pp x dp;
* the corpus indexes are well formed and their largest token id (recorded by the corpus tool) is below the
  model's vocabulary;
* the model's fp32 weights, gradients and Adam states fit the device's free memory ("needs X GiB, has Y");
* ``--save`` is a directory this rank can write, with free space for one checkpoint, and rank 0 (the only writer)
  can append to ``--log-jsonl`` and write ``--tensorboard-dir``.

The memory and disk checks depend on the machine a rank runs on: their errors are :class:`MachineError`, printed
by the first rank of each machine (the others are printed by rank 0 alone: every rank finds the same).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
from pathlib import Path

from repro.dist.launch import LaunchEnv, read_launch_env
from repro.environment import SettingError, check_environment, local_world_size
from repro.training.config import SYNTHETIC_VOCAB, TrainConfig
from repro.training.failfast import UsageError

GIB = 2**30
#: fp32 weights (4 B), gradients (4 B) and Adam's two moments (8 B) per parameter, before any ZeRO sharding
WEIGHT_BYTES, GRAD_BYTES, ADAM_BYTES = 4, 4, 8
#: one checkpoint holds fp32 weights and Adam's moments: 12 B per parameter (per dp rank without ZeRO)
CHECKPOINT_BYTES = WEIGHT_BYTES + ADAM_BYTES


class MachineError(UsageError):
    """A check that depends on this rank's machine (its memory, its disks): printed by the machine's first rank."""


class LaunchError(UsageError):
    """A launch variable of this rank's own environment is bad: printed by the rank that finds it (a rank whose
    RANK is not a number, or out of range, cannot know whether it is the first)."""


def _env_int(name: str) -> int | None:
    """An integer launch variable, None when unset; a one-line :class:`UsageError` when it is not a number."""
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise LaunchError(f"launch variable {name}={value!r} is not an integer") from None
    if not -2**31 < number < 2**31:
        raise LaunchError(f"launch variable {name}={value} is out of range: it must be below 2**31")
    return number


def speaks(err: UsageError) -> bool:
    """Whether this rank prints ``err``: rank 0 does; every rank prints a :class:`LaunchError` (its own variables),
    and the first rank of each machine a :class:`MachineError`."""
    if isinstance(err, LaunchError):
        return True
    try:
        rank = _env_int("RANK") if "RANK" in os.environ else _env_int("SLURM_PROCID")
        local = _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else _env_int("SLURM_LOCALID")
    except UsageError:
        return True
    return not rank or (isinstance(err, MachineError) and not local)


def machine_error(launch: LaunchEnv, message: str) -> MachineError:
    """A :class:`MachineError` whose message says which rank and host found it when there are several ranks."""
    where = f"rank {launch.rank} on {socket.gethostname()}: " if launch.world_size > 1 else ""
    return MachineError(where + message)


def check_launch(config: TrainConfig) -> tuple[LaunchEnv, int]:
    """(launch variables, data-parallel size): whole numbers in range, and world = tp x pp x dp."""
    from repro.dist.groups import resolve_grid

    for name in ("LOCAL_RANK", "SLURM_LOCALID", "LOCAL_WORLD_SIZE"):
        if (value := _env_int(name)) is not None and value < 0:
            raise LaunchError(f"launch variable {name}={value} must be an integer >= 0")
    try:
        local_world_size()  # a launch variable of this rank: every rank says it
    except SettingError as err:
        raise LaunchError(str(err)) from None
    try:
        check_environment()  # the suite's own settings (the same on every rank: rank 0 says it)
    except SettingError as err:
        raise UsageError(str(err)) from None
    try:
        launch = read_launch_env()
    except ValueError as err:
        message = str(err)
        if "launch variable" not in message:  # e.g. "rank 3 is outside [0, world size 2)": name the variables
            torchrun = "RANK" in os.environ or "WORLD_SIZE" in os.environ
            names = ("RANK", "WORLD_SIZE") if torchrun else ("SLURM_PROCID", "SLURM_NTASKS")
            message = "launch variables " + ", ".join(f"{n}={os.environ.get(n)!r}" for n in names) + ": " + message
        raise LaunchError(message) from None
    try:
        layout = config.parallelism
        grid = resolve_grid(launch.world_size, tp=layout.tp, pp=layout.pp, dp=layout.dp)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return launch, grid.dp


# ---- memory ---------------------------------------------------------------------------------------------------

def available_bytes(device: str, local_rank: int) -> tuple[int, str]:
    """(bytes this rank may allocate on ``device``, where the number comes from).

    CUDA: the free memory of the rank's GPU (``torch.cuda.mem_get_info``). CPU: the machine's probe
    (:func:`repro.machine.host_memory`: MemAvailable capped by a container's limit), shared by the LOCAL_WORLD_SIZE
    ranks of this machine."""
    if device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(local_rank)
        return free, f"free on cuda:{local_rank}"
    from repro.machine import host_memory

    free, source = host_memory()
    ranks = local_world_size() or 1
    return free // ranks, source + (f", shared by {ranks} ranks" if ranks > 1 else "")


def parameters_per_rank(config, *, tp: int, pp: int) -> int:
    """Parameters of this rank's share of the busiest pipeline stage: its layers and the (tied) embedding, split
    over tp (the position embedding and layer norms are not split; they are small)."""
    from repro.models.params import layer_parameters

    layers = math.ceil(config.num_layers / pp) * layer_parameters(config)
    embedding = config.padded_vocab_size(tp) * config.hidden_size
    return (layers + embedding) // tp + config.max_position_embeddings * config.hidden_size + 2 * config.hidden_size


def state_bytes(params: int, *, dp: int, zero) -> tuple[int, int]:
    """(bytes on the compute device, bytes in host memory) of ``params`` parameters' fp32 weights, gradients and
    Adam states under ``zero`` (a :class:`repro.zero.config.ZeroConfig`, or None for plain data parallelism).

    ZeRO sec 5: stage 1 splits the optimizer states over dp, stage 2 also the gradients, stage 3 also the weights;
    an offload tier moves the optimizer states (or the weights) to CPU memory, or to NVMe (neither)."""
    stage = zero.stage if zero is not None else 0
    weights = params * WEIGHT_BYTES // (dp if stage >= 3 else 1)
    grads = params * GRAD_BYTES // (dp if stage >= 2 else 1)
    adam = params * ADAM_BYTES // (dp if stage >= 1 else 1)
    device, host = grads, 0
    for part, tier in ((adam, zero.offload_optimizer.device if zero else "none"),
                       (weights, zero.offload_param.device if zero else "none")):
        if tier == "none":
            device += part
        elif tier == "cpu":
            host += part
    return device, host


def activation_bytes(config: TrainConfig) -> int:
    """A lower bound on the activations one micro-batch keeps on the busiest stage (so that a run refused here
    could not have fit): per layer the tensors its backward needs at the least (Korthikanti et al. 2022, sec. 4.1,
    without the attention scores, which a fused attention kernel never stores): its input (s b h, not split over
    tp) and, split over tp, the QKV projection (3 s b h), the attention output (s b h) and the MLP's hidden and
    GeLU output (8 s b h); under --activation-checkpointing only the input, plus one layer's set while it is
    recomputed. The logits (s b V / tp) come on top, once. Elements are 4 bytes in fp32, 2 under bf16/fp16."""
    model, training, layout = config.gpt_config(), config.training, config.parallelism
    element = 4 if training.precision == "fp32" else 2
    tokens, hidden, tp = training.micro_batch_size * config.model.seq_len, model.hidden_size, layout.tp
    layers = math.ceil(model.num_layers / layout.pp)
    full_layer = tokens * (hidden + 12 * hidden // tp)
    per_layer = tokens * hidden if training.activation_checkpointing else full_layer
    stored = layers * per_layer + (full_layer if training.activation_checkpointing else 0)
    return (stored + tokens * model.padded_vocab_size(tp) // tp) * element


def check_batch_memory(config: TrainConfig, *, launch: LaunchEnv) -> None:
    """Refuse a global batch whose int64 tokens alone (every rank builds the whole global batch, micro-batch size x
    micro-batches x dp sequences of --seq-len + 1 tokens, in host memory) exceed this rank's share of host memory."""
    training, dp, seq_len = config.training, config.parallelism.dp, config.model.seq_len
    sequences = training.micro_batch_size * training.micro_batches * dp
    needs = sequences * (seq_len + 1) * 8
    has, source = available_bytes("cpu", launch.local_rank)
    if needs > has:
        raise machine_error(launch, f"--micro-batch-size {training.micro_batch_size} x --micro-batches "
                                    f"{training.micro_batches} x dp {dp} = {sequences:,} sequences of --seq-len "
                                    f"{seq_len} + 1 tokens: the global batch's int64 tokens need "
                                    f"{needs / GIB:,.1f} GiB of host memory per rank; it must fit the "
                                    f"{has / GIB:,.1f} GiB this machine has ({source})")


def check_memory(config: TrainConfig, *, launch: LaunchEnv) -> None:
    """Refuse a model whose states and one micro-batch's activations (a lower bound) exceed this rank's free
    memory (``config`` resolved: its dp and vocabulary known)."""
    from repro.dist.device import select_device
    from repro.models.params import count_parameters

    check_batch_memory(config, launch=launch)
    training, layout, model = config.training, config.parallelism, config.gpt_config()
    tp, pp, dp, seq_len = layout.tp, layout.pp, layout.dp, config.model.seq_len
    try:
        device = select_device(training.device, local_rank=launch.local_rank).type
    except ValueError as err:
        raise machine_error(launch, f"--device {training.device}: {err}") from None
    total = count_parameters(model, tp)
    on_device, on_host = state_bytes(parameters_per_rank(model, tp=tp, pp=pp), dp=dp, zero=layout.zero)
    needs = on_device + (on_host if device == "cpu" else 0)
    has, source = available_bytes(device, launch.local_rank)
    if needs > has:
        shape = (f"--layers {model.num_layers} --hidden {model.hidden_size} --vocab {model.vocab_size} --seq-len "
                 f"{seq_len}")
        raise machine_error(launch, f"{shape}: the model ({total:,} parameters) needs at least "
                                    f"{needs / GIB:,.1f} GiB on {device} per rank for fp32 weights, gradients and "
                                    f"Adam states (tp {tp}, pp {pp}, dp {dp}, ZeRO stage "
                                    f"{layout.zero_stage}); this machine has {has / GIB:,.1f} GiB ({source})")
    activations = activation_bytes(config)
    if needs + activations > has:
        hint = "" if training.activation_checkpointing else ", --activation-checkpointing"
        raise machine_error(launch, f"--micro-batch-size {training.micro_batch_size} --seq-len "
                                    f"{seq_len}: one micro-batch's activations need at least "
                                    f"{activations / GIB:,.1f} GiB on {device} per rank ({training.precision}, tp "
                                    f"{tp}, pp {pp}), on top of {needs / GIB:,.1f} GiB of model states; this "
                                    f"machine has {has / GIB:,.1f} GiB ({source}): lower them, or raise --tp / "
                                    f"--pp{hint}")
    if device == "cuda" and on_host:
        free, source = available_bytes("cpu", launch.local_rank)
        if on_host > free:
            raise machine_error(launch, f"the offloaded states of the model ({total:,} parameters) need "
                                        f"{on_host / GIB:,.1f} GiB of CPU memory per rank; this machine has "
                                        f"{free / GIB:,.1f} GiB ({source})")


# ---- files ----------------------------------------------------------------------------------------------------

def _make_dir(option: str, path: Path, launch: LaunchEnv) -> None:
    from repro.paths import writable_dir_problem

    problem = writable_dir_problem(path)
    if problem is not None:
        raise machine_error(launch, f"{option} {path} {problem}")


def check_outputs(config: TrainConfig, *, launch: LaunchEnv) -> None:
    """``--save`` writable with room for one checkpoint (every rank writes its shard there); ``--log-jsonl`` and
    ``--tensorboard-dir`` writable by rank 0, which alone writes them."""
    save_dir = config.checkpoint.save
    if save_dir is not None:
        save = Path(save_dir)
        _make_dir("--save", save, launch)
        free = shutil.disk_usage(save).free
        layout = config.parallelism
        needs = checkpoint_bytes(config.gpt_config(), tp=layout.tp, dp=layout.dp, zero_stage=layout.zero_stage)
        if needs > free:
            raise machine_error(launch, f"--save {save}: one checkpoint needs about {needs / GIB:,.2f} "
                                        f"GiB (fp32 weights and Adam states), the file system has "
                                        f"{free / GIB:,.2f} GiB free")
    if launch.rank != 0:
        return
    if config.logging.tensorboard_dir is not None:
        _make_dir("--tensorboard-dir", Path(config.logging.tensorboard_dir), launch)
    jsonl = config.log_jsonl
    if jsonl is not None:
        from repro.paths import appendable_file_problem

        option = "--log-jsonl" if config.logging.log_jsonl else "--save (its log.jsonl)"
        problem = appendable_file_problem(jsonl)
        if problem is not None:
            raise machine_error(launch, f"{option} {jsonl} {problem}")


def checkpoint_bytes(config, *, tp: int, dp: int, zero_stage: int) -> int:
    """Bytes of one checkpoint: 12 B per parameter, once per dp rank without ZeRO (each keeps its own copy)."""
    from repro.models.params import count_parameters

    return count_parameters(config, tp) * CHECKPOINT_BYTES * (dp if zero_stage == 0 else 1)


# ---- corpora --------------------------------------------------------------------------------------------------

def check_data(config: TrainConfig, *, vocab_given: bool) -> int:
    """The model's vocabulary (``--vocab``, else 256 for synthetic data, else the --data index's vocab_size), once
    the largest token id of --data and --valid-data is checked to lie below it: the model's embedding has one row
    per id, so a larger id would fail at the step that reads it. ``vocab_given``: --vocab was on the command line."""
    data, vocab = config.data, config.model.vocab
    for option, prefix in (("--data", data.data), ("--valid-data", data.valid_data)):
        if prefix in (None, "synthetic"):
            continue
        found, largest, recorded = check_corpus(option, prefix, seq_len=config.model.seq_len,
                                                seed=config.training.seed)
        if vocab is None:
            vocab = found  # --data comes first
        if largest >= vocab:
            source = "--vocab" if vocab_given else ("the default for synthetic data" if data.data == "synthetic"
                                                    else "the vocab_size of the --data index")
            raise UsageError(f"{option} {prefix} holds token ids up to {largest} ({recorded}): every "
                             f"id must be below the vocabulary, {vocab} ({source})")
    return vocab if vocab is not None else SYNTHETIC_VOCAB


def check_corpus(option: str, prefix: str, *, seq_len: int, seed: int) -> tuple[int, int, str]:
    """(the index's vocab_size, its largest token id, where that comes from) of a well-formed corpus holding at
    least one sample.

    Reads the index, stats the .bin (its checksum is verified when the trainer opens it) and takes the largest
    token id of the .bin in one read (about 0.3 s per GB), so an index that understates it is refused here, not at
    the step that reads the token."""
    from repro.training.corpus import CorpusError, TokenCorpus, max_token_id

    for path in (Path(f"{prefix}.idx.json"), Path(f"{prefix}.bin")):
        if path.is_dir():
            raise UsageError(f"{option} {prefix}: {str(path)!r} is a directory; the corpus is two files, "
                             f"{prefix}.idx.json and {prefix}.bin")
    try:
        corpus = TokenCorpus(prefix, verify=False)
        corpus.samples(seq_len, seed=seed)
    except (CorpusError, ValueError) as err:
        raise UsageError(f"{option} {prefix}: {err}") from None
    digest = corpus.index["bin_sha256"]
    if not re.fullmatch("[0-9a-f]{64}", digest):
        raise UsageError(f"{option} {prefix}: its index's bin_sha256 {digest[:80]!r} is not a sha256 (64 hex "
                         f"digits); the index is damaged, tokenize the corpus again")
    largest = max_token_id(corpus.index)
    if largest is None:
        raise UsageError(f"{option} {prefix}: its index records no max_token_id and no known tokenizer, so its token "
                         "ids cannot be checked against the vocabulary; tokenize it again with python -m "
                         "repro.training.corpus (which records max_token_id)")
    actual = int(corpus.tokens.max()) if len(corpus.tokens) else 0
    if actual > largest:
        raise UsageError(f"{option} {prefix}: {prefix}.bin holds token id {actual}, above the largest its index "
                         f"records ({largest}); the index does not describe this .bin, tokenize it again")
    recorded = ("its index's max_token_id" if "max_token_id" in corpus.index
                else "GPT-2's largest id: its index predates max_token_id")
    return corpus.vocab_size, largest, recorded
