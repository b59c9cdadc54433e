"""Megatron-LM's option names for ``repro train``, with Megatron's meaning, so a Megatron command line runs here.

Two kinds. Where a repro option means what a Megatron-LM option means, the Megatron name is a second name of the
same option (:data:`ALIASES`; ``--help`` shows both: ``--layers LAYERS, --num-layers LAYERS``). Where Megatron says
the same thing another way, its option is kept and translated (:func:`add_megatron_options`):

* ``--global-batch-size G``: Megatron's micro-batches per step are ``G / (micro-batch size x dp)`` (its
  ``num_microbatches_calculator``), i.e. repro's ``--micro-batches``; a G that does not divide is refused;
* ``--bf16`` / ``--fp16``: ``--precision bf16|fp16`` (autocast over fp32 master weights, fp16 with dynamic loss
  scaling, as Megatron's mixed precision);
* ``--use-distributed-optimizer``: ``--zero-stage 1``, which shards the fp32 master weights and Adam moments over dp
  and reduce-scatters the gradients into their owner's shard, as Megatron's distributed optimizer does;
* ``--distributed-timeout-minutes M``: ``--timeout-s 60 M``;
* ``--hidden-dropout`` / ``--attention-dropout``: the two dropouts apart (default: ``--dropout``, which sets both);
* ``--make-vocab-size-divisible-by N``: the embedding is padded to a multiple of N x tp (Megatron's rule; the padding
  rows are masked out of the softmax here, so it changes memory and layout, not the loss).

Megatron options repro has no counterpart for (``--max-position-embeddings`` apart from ``--seq-length``,
``--recompute-granularity selective``, ``--lr-warmup-fraction``, data blends of several ``--data-path`` prefixes)
are refused by argparse as unknown, naming them.
"""

from __future__ import annotations

import argparse

from repro.cliargs import positive_float, positive_int, probability
from repro.training.failfast import UsageError

#: repro's option -> Megatron-LM's name for it (the same meaning, the same values)
ALIASES: dict[str, str] = {
    "--tp": "--tensor-model-parallel-size",
    "--pp": "--pipeline-model-parallel-size",
    "--layers": "--num-layers",
    "--hidden": "--hidden-size",
    "--heads": "--num-attention-heads",
    "--vocab": "--vocab-size",
    "--seq-len": "--seq-length",
    "--steps": "--train-iters",
    "--data": "--data-path",
    "--valid-data": "--valid-data-path",
    "--activation-checkpointing": "--checkpoint-activations",
}


def names(option: str) -> tuple[str, ...]:
    """``option`` and its Megatron-LM name, if it has one: ``add_argument(*names("--tp"), ...)``."""
    return (option, ALIASES[option]) if option in ALIASES else (option,)


def _minutes(text: str) -> float:
    """--distributed-timeout-minutes: minutes, returned as seconds (--timeout-s's unit)."""
    return positive_float(text) * 60.0


def add_megatron_options(parser: argparse.ArgumentParser) -> None:
    """The Megatron-LM options that say what a repro option says in another way (module docstring)."""
    g = parser.add_argument_group("Megatron-LM's options", "Megatron-LM's way of saying what the options above say; "
                                  "the other Megatron names are second names of the options above")
    g.add_argument("--global-batch-size", type=positive_int, default=None, metavar="G",
                   help="sequences per iteration over all dp ranks: sets --micro-batches to G / (--micro-batch-size "
                        "x dp), which must divide (default: --micro-batch-size x --micro-batches x dp)")
    g.add_argument("--bf16", dest="precision", action="store_const", const="bf16",
                   help="Megatron's name for --precision bf16")
    g.add_argument("--fp16", dest="precision", action="store_const", const="fp16",
                   help="Megatron's name for --precision fp16 (dynamic loss scaling)")
    g.add_argument("--use-distributed-optimizer", dest="zero_stage", action="store_const", const=1,
                   help="Megatron's distributed optimizer: --zero-stage 1 (master weights and Adam moments sharded "
                        "over dp, gradients reduce-scattered into their owner's shard)")
    g.add_argument("--distributed-timeout-minutes", dest="timeout_s", type=_minutes, default=argparse.SUPPRESS,
                   metavar="M", help="--timeout-s in minutes (default: --timeout-s's 30 s)")
    g.add_argument("--hidden-dropout", type=probability, default=None,
                   help="dropout after the attention and MLP blocks, in [0, 1) (default: --dropout)")
    g.add_argument("--attention-dropout", type=probability, default=None,
                   help="dropout of the attention probabilities, in [0, 1) (default: --dropout)")
    g.add_argument("--make-vocab-size-divisible-by", type=positive_int, default=128, metavar="N",
                   help="pad the embedding to a multiple of N x --tp rows (masked out of the softmax)")


def resolve_global_batch(global_batch_size: int | None, *, micro_batch_size: int, micro_batches: int, dp: int,
                         fixed_by: str | None = None) -> tuple[int, int]:
    """(micro-batches per iteration, global batch) of Megatron's ``--global-batch-size``: it sets the micro-batches
    (Megatron's ``num_microbatches_calculator``), refused where it does not divide, or where it contradicts the
    micro-batches ``fixed_by`` names (``--micro-batches`` given, or a DeepSpeed config's batch keys); without it,
    the global batch the others make, as Megatron's argument dump shows it."""
    per_micro_batch = micro_batch_size * dp
    if global_batch_size is None:
        return micro_batches, micro_batches * per_micro_batch
    if global_batch_size % per_micro_batch:
        raise UsageError(f"--global-batch-size {global_batch_size} must be a multiple of --micro-batch-size "
                         f"{micro_batch_size} x dp {dp} = {per_micro_batch} (micro-batches per iteration = "
                         "global batch / (micro-batch size x dp), as in Megatron-LM)")
    steps = global_batch_size // per_micro_batch
    if fixed_by is not None and micro_batches != steps:
        raise UsageError(f"--global-batch-size {global_batch_size} contradicts {fixed_by}: {micro_batches} "
                         f"micro-batches of {micro_batch_size} on dp {dp} make {micro_batches * per_micro_batch}; "
                         "drop one of them")
    return steps, global_batch_size
