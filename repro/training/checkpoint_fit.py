"""Whether a checkpoint's tensors can continue this run: the same tensors, shapes and dtypes as the trainer's own,
and finite weights.

A rank file that passes its sha256 was written by *someone*; whether it was written by this model is another
question. A tp-2 shard inside a one-process checkpoint, a ``trainer.json`` edited to disagree with its shards, fp16
weights in place of the fp32 masters, weights that are inf or NaN: each used to reach ``load_state_dict`` (a
RuntimeError traceback), or worse, load (fp16 weights changed the losses in the sixth digit; NaN weights trained on
to NaN). Here the payload is compared, tensor by tensor, with the state the trainer would save itself, before any
rank loads anything (the ranks then agree on the verdict, :func:`repro.training.checkpoint.load_training_checkpoint`),
and the first difference is named: the key, what the file holds and what this run's model needs.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch


def tensors(tree: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a nested state (dicts, lists, tuples), with its path ``a.b.0.c``."""
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, (list, tuple)):
        for index, value in enumerate(tree):
            yield from tensors(value, f"{prefix}.{index}" if prefix else str(index))


def _describe(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"


def difference(saved: Any, mine: Any, what: str) -> str | None:
    """The first tensor where ``saved`` differs from ``mine`` (a missing or unexpected one, another shape or dtype),
    in words starting with ``what`` (e.g. "its model state"); None when every tensor fits."""
    theirs, ours = dict(tensors(saved)), dict(tensors(mine))
    for key, tensor in ours.items():
        if key not in theirs:
            return f"{what} lacks {key!r} ({_describe(tensor)} in this run's model)"
        held = theirs[key]
        if held.shape != tensor.shape or held.dtype != tensor.dtype:
            return f"{what} holds {key!r} as {_describe(held)}, this run's model needs {_describe(tensor)}"
    unexpected = sorted(set(theirs) - set(ours))
    if unexpected:
        return f"{what} holds {unexpected[0]!r}, which this run's model does not have"
    return None


def non_finite(tree: Any, what: str) -> str | None:
    """The first floating-point tensor of ``tree`` holding inf or NaN, in words starting with ``what``, or None."""
    for key, tensor in tensors(tree):
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
            return f"{what} {key!r} holds non-finite values (inf or nan)"
    return None


def _tensor_problem(held: Any, need: torch.Tensor, what: str) -> str | None:
    if not isinstance(held, torch.Tensor):
        return f"{what} is a {type(held).__name__}, this run's model needs a tensor of {_describe(need)}"
    if held.shape != need.shape or held.dtype != need.dtype:
        return f"{what} is {_describe(held)}, this run's model needs {_describe(need)}"
    return None


def optimizer_difference(saved: Any, optimizer) -> str | None:
    """The first tensor of a saved optimizer state that does not fit ``optimizer``: the data-parallel optimizer's
    torch states (each moment has its parameter's shape), or ZeRO's buckets (each bucket's fp32 master, and each
    moment the master's shape). Lazily created states (the moments before the first step) are not required."""
    if not isinstance(saved, dict):
        return f"its optimizer state is a {type(saved).__name__}, not a dict"
    params = getattr(optimizer, "params", None)
    flat = getattr(optimizer, "flat", None)
    if "layout" in saved and flat is not None:  # the flat format: one torch parameter per flat buffer
        if saved["layout"] != flat.layout():
            return ("its optimizer state was laid out for other parameters (names, sizes or dtypes differ from this "
                    "run's model)")
        params = [group.data for group in flat.groups]
    if "torch" in saved and params is not None:  # repro.training.optim.DataParallelOptimizer
        torch_state = saved["torch"]
        count = sum(len(group.get("params", ())) for group in torch_state.get("param_groups", ()))
        if count != len(params):
            return f"its optimizer state covers {count} parameters, this run's model has {len(params)}"
        for index, entry in torch_state.get("state", {}).items():
            if not isinstance(index, int) or not 0 <= index < len(params):
                return f"its optimizer state holds parameter {index!r}, this run's model has {len(params)}"
            for name, tensor in entry.items():
                if isinstance(tensor, torch.Tensor) and tensor.dim() == 0:
                    continue  # a step count
                problem = _tensor_problem(tensor, params[index].detach(), f"its optimizer state {name!r} of "
                                                                          f"parameter {index}")
                if problem is not None:
                    return problem
        return None
    if "buckets" not in saved:
        return "its optimizer state has neither the data-parallel optimizer's layout nor ZeRO's buckets"
    mine = optimizer.state_dict().get("buckets", [])
    theirs = saved["buckets"]
    if not isinstance(theirs, list) or len(theirs) != len(mine):
        return (f"its optimizer state has {len(theirs) if isinstance(theirs, list) else theirs!r} buckets, this run's "
                f"optimizer {len(mine)}")
    for index, (held, need) in enumerate(zip(theirs, mine)):
        master = need["state"]["master"]
        state = held.get("state") if isinstance(held, dict) else None
        if not isinstance(state, dict):
            return f"its optimizer state's bucket {index} holds no state"
        problem = _tensor_problem(state.get("master"), master, f"its optimizer bucket {index}'s master weights")
        if problem is not None:
            return problem
        for name, tensor in (state.get("tensors") or {}).items():
            problem = _tensor_problem(tensor, master, f"its optimizer bucket {index}'s {name!r}")
            if problem is not None:
                return problem
    return None


def fit_problem(model: dict | None, optimizer: dict, trainer) -> str | None:
    """Why this rank's payload (its ``model`` state, None under ZeRO, and its ``optimizer`` state, already re-cut
    for this rank) cannot be loaded into ``trainer``: a tensor that differs from the trainer's own, or weights and
    optimizer states that are not finite. None when it fits."""
    try:
        if model is not None:
            problem = difference(model, trainer.stage.state_dict(), "its model state")
            if problem is not None:
                return problem
        problem = optimizer_difference(optimizer, trainer.optimizer)
        if problem is not None:
            return problem
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as err:
        return f"its optimizer state does not have the layout of this run's optimizer ({type(err).__name__}: {err})"
    for tree, what in ((model, "its model weight"), (optimizer, "its optimizer state")):
        problem = non_finite(tree, what) if tree is not None else None
        if problem is not None:
            return (f"{problem}: weights that are not finite cannot continue a run; resume from an earlier "
                    "checkpoint")
    return None
