"""Optimizer checkpoints written per parameter, read into flat buffers.

Before the trainer's optimizer stepped flat buffers (:mod:`repro.training.flat_buffers`), its checkpoints held a torch
optimizer's ``state_dict`` over the model's parameters: per parameter index (model order) its ``step`` and its
moments (``exp_avg``, ``exp_avg_sq`` for AdamW). :func:`flat_torch_state` turns such a state into the one a torch
optimizer over the flat buffers loads: each moment copied into its parameter's slice of a flat tensor laid out as the
buffer, the ``step`` shared (every parameter of a buffer must have taken the same number of steps, which a trainer
whose parameters all get gradients guarantees). Pure tensor copies on the host: nothing is unpickled here.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from repro.training.flat_buffers import FlatParameters


def _same(values: list[Any], what: str) -> Any:
    """The one value every parameter of a buffer holds for ``what`` (ValueError when they differ)."""
    first = values[0]
    for value in values[1:]:
        equal = torch.equal(value, first) if isinstance(value, torch.Tensor) and isinstance(first, torch.Tensor) \
            else value == first
        if not equal:
            raise ValueError(f"the checkpoint's per-parameter optimizer state differs in {what!r} between parameters "
                             f"of one buffer ({first!r} and {value!r}); it cannot be read into one flat state")
    return first


def flat_torch_state(per_parameter: Mapping[str, Any], flat: FlatParameters) -> dict[str, Any]:
    """The state dict of a torch optimizer over ``[g.data for g in flat.groups]`` equal to ``per_parameter``, a
    torch optimizer's state dict over ``flat.params`` (model order, one param group)."""
    saved_groups = per_parameter["param_groups"]
    indices = [i for group in saved_groups for i in group["params"]]
    if len(indices) != len(flat.params):
        raise ValueError(f"the checkpoint's optimizer state covers {len(indices)} parameters, this model has "
                         f"{len(flat.params)}")
    options_of = {}
    for group in saved_groups:
        for i in group["params"]:
            options_of[i] = {k: v for k, v in group.items() if k != "params"}
    per_state = per_parameter["state"]
    model_order = {id(p): i for i, p in enumerate(flat.params)}
    state: dict[int, dict[str, Any]] = {}
    groups = []
    for group in flat.groups:
        members = [model_order[id(p)] for p in group.params]  # model-order index of each, in buffer order
        shapes = {i: tuple(flat.params[i].shape) for i in members}
        groups.append({**_same([options_of[indices[i]] for i in members], "hyperparameters"),
                       "params": [group.index]})
        present = [indices[i] in per_state for i in members]
        if not any(present):
            continue
        if not all(present):
            raise ValueError("the checkpoint's per-parameter optimizer state has states for some parameters of a "
                             "buffer and not for others; it cannot be read into one flat state")
        entries = [per_state[indices[i]] for i in members]
        names = _same([sorted(entry) for entry in entries], "state names")
        merged: dict[str, Any] = {}
        for name in names:
            values = [entry[name] for entry in entries]
            if all(isinstance(v, torch.Tensor) and tuple(v.shape) == shapes[i] and v.dim() > 0
                   for v, i in zip(values, members)):
                out = torch.empty(group.numel, dtype=values[0].dtype)
                for position, value in enumerate(values):
                    start, stop = group.slot(position)
                    out[start:stop].copy_(value.reshape(-1))
                merged[name] = out
            else:  # a scalar such as AdamW's step: one for the buffer
                merged[name] = _same(values, name)
        state[group.index] = merged
    return {"state": state, "param_groups": groups}
