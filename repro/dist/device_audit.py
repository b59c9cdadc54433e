"""Device audit: on CPU, catch the tensors that would reach a collective on the wrong device on GPU ranks.

nccl reduces GPU tensors only: a control tensor made with ``torch.tensor([...])`` (no ``device=``) lands on the
CPU, and the first multi-GPU run fails in its collective ("No backend type associated with device type cpu").
Under gloo on CPU every tensor is a CPU tensor, so the same code passes every CPU test. This audit makes the
difference visible on CPU: it remembers which tensors were made *without an explicit device* and fails a
collective that receives one.

Inside ``with device_audit():`` (in each rank process):

* **Tagging** (a :class:`torch.overrides.TorchFunctionMode`). A factory (``torch.tensor``, ``empty``, ``zeros``,
  ``ones``, ``full``, ``arange``, ``rand*``, ``randn*``, ``randint``, ``randperm``, ``linspace``, ``eye``, ...;
  ``torch.from_numpy`` and ``torch.frombuffer``, which torch does not route through modes, are wrapped) called
  with no ``device=`` (``device=None`` counts as none) tags its result with the file and line that called it.
  ``pin_memory=True`` is an explicit host placement and is not tagged.
* **Inheriting.** Any other op whose tensor inputs are all tagged tags its outputs (``x.double()``, ``x[0]``,
  ``torch.cat``, ``.grad`` of a tagged parameter, ...): it runs where its inputs are, so its output is where they
  are. ``*_like`` factories and ``Tensor.new_*`` inherit their source tensor's tag the same way (they take its
  device), and so does ``torch.tensor(t)`` of a tensor. ``nn.Parameter(t)`` inherits ``t``'s tag, and
  ``p.data = t`` gives ``p`` the tag of ``t``.
* **Clearing.** An explicit placement clears the tag: any call with ``device=`` given, ``.to(device)``,
  ``.to(other)`` (takes ``other``'s tag), ``.cuda()``. On the CPU ``.to("cpu")`` returns the same tensor, so the
  tag is cleared in place. ``.cpu()`` changes nothing (on CPU it is the same tensor; a moved-to-host GPU tensor is
  beyond what a CPU run can see).
* **Checking.** The collectives of ``torch.distributed`` (``all_reduce``, ``all_gather*``, ``reduce_scatter*``,
  ``broadcast``, ``reduce``, ``all_to_all*``, ``gather``, ``scatter``, ``send``/``recv``/``isend``/``irecv``,
  ``batch_isend_irecv``), which :mod:`repro.dist.comm` calls as ``dist.<name>`` at call time, plus comm's two
  renamed aliases, are wrapped: a tagged tensor (alone, in a list, or in a ``P2POp``) raises
  :class:`CollectiveDeviceError` naming the collective and where the tensor was made. Under nccl the wrapper also
  rejects any non-CUDA tensor, so the audit means the same on GPU ranks.

What passes: tensors placed on the compute device (``device=...``, ``.to(device)``), tensors derived from them,
and control tensors made with ``device="cpu"`` on purpose, for a gloo group the code creates itself (say so in a
comment there). What the audit cannot see: a tensor made with an explicit CPU device (or ``.cpu()``) and handed to
an nccl group; tensors torch makes in C++ without a Python call (``torch.load``, autograd's gradients, which
follow their parameter anyway).

Only for tests: the mode runs every torch call through Python (a few microseconds each) and the wrappers replace
module attributes of ``torch.distributed`` for as long as the audit is active.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.overrides import TorchFunctionMode

#: attribute that marks a tensor made without an explicit device; its value says where it was made
TAG = "_repro_made_without_device"

_FACTORIES = frozenset(getattr(torch, name) for name in (
    "tensor", "as_tensor", "asarray", "scalar_tensor", "empty", "empty_strided", "zeros", "ones", "full", "arange",
    "range", "linspace", "logspace", "eye", "rand", "randn", "randint", "randperm", "normal", "tril_indices",
    "triu_indices", "sparse_coo_tensor",
) if hasattr(torch, name))
#: factories whose first argument may be a tensor, which then decides the device (``torch.tensor(t)``)
_FROM_DATA = frozenset((torch.tensor, torch.as_tensor, torch.asarray))
_COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                "all_gather_single", "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor",
                "reduce_scatter_single", "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv",
                "isend", "irecv", "batch_isend_irecv")
#: frames of these files are skipped when naming where a tensor was made
_SKIP_FILES = (os.path.dirname(torch.__file__) + os.sep, __file__)
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_DATA = torch._C.TensorBase.__dict__["data"]  # the ``.data`` property: its setter re-points a tensor
_BACKWARD = (torch.Tensor.backward,)


class CollectiveDeviceError(RuntimeError):
    """A collective received a tensor that was made without a device (or, under nccl, is not on a GPU)."""


def made_without_device(tensor: torch.Tensor) -> str | None:
    """Where ``tensor`` was made without an explicit device (``file:line (function)``), or None."""
    return getattr(tensor, TAG, None)


def _caller() -> str:
    """``file:line (function)`` of the innermost frame outside torch and this file."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_FILES):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    name = frame.f_code.co_filename.removeprefix(_REPO)
    return f"{name}:{frame.f_lineno} ({frame.f_code.co_name})"


def _tag(tensor: torch.Tensor, origin: str | None) -> None:
    if origin is not None:
        setattr(tensor, TAG, origin)
    elif getattr(tensor, TAG, None) is not None:
        delattr(tensor, TAG)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Tensors in ``value``, in lists/tuples/dicts one or two levels deep (argument lists of torch calls)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, torch.Tensor):
                yield item
            elif isinstance(item, (list, tuple)):
                yield from (x for x in item if isinstance(x, torch.Tensor))
    elif isinstance(value, dict):
        yield from (x for x in value.values() if isinstance(x, torch.Tensor))


def _inherited(args: tuple, kwargs: dict) -> str | None:
    """The origin to give an op's outputs: the first input's, when every tensor input is tagged; else None."""
    origin = None
    for value in (*args, *kwargs.values()):
        for tensor in _tensors(value):
            mine = getattr(tensor, TAG, None)
            if mine is None:
                return None
            origin = origin or mine
    return origin


def _to_target(args: tuple, kwargs: dict) -> tuple[bool, str | None]:
    """For ``Tensor.to(*args, **kwargs)`` (``args`` without self): (moves to an explicit place?, that place's
    tag: None for a device, the other tensor's tag for ``.to(other)``)."""
    if kwargs.get("device") is not None:
        return True, None
    if args:
        first = args[0]
        if isinstance(first, torch.Tensor):
            return True, getattr(first, TAG, None)
        if isinstance(first, (str, torch.device, int)) and not isinstance(first, bool):
            return True, None
    return False, None


class _Mode(TorchFunctionMode):
    """Tags tensors made without a device and carries the tags through ops (see the module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _BACKWARD:  # run backward with this mode active, so custom backward code is audited too
            return self._backward(*args, **kwargs)
        result = func(*args, **kwargs)
        if getattr(func, "__self__", None) is _DATA and func.__name__ == "__set__":  # p.data = t: p is where t is
            _tag(args[0], getattr(args[1], TAG, None))
            return result
        if not isinstance(result, (torch.Tensor, list, tuple)):
            return result
        if kwargs.get("device") is not None:
            origin = None
        elif func in _FACTORIES:
            data = args[0] if args else kwargs.get("data")
            if func in _FROM_DATA and isinstance(data, torch.Tensor):  # torch.tensor(t): where t is
                origin = getattr(data, TAG, None)
            elif func not in _FROM_DATA and any(True for v in (*args, *kwargs.values()) for _ in _tensors(v)):
                origin = _inherited(args, kwargs)  # torch.normal(mean, std) and the like: where their inputs are
            elif kwargs.get("pin_memory"):  # page-locked host memory: placed on the CPU on purpose
                origin = None
            else:
                origin = _caller()
        elif func is torch.Tensor.to:
            explicit, target = _to_target(args[1:], kwargs)
            origin = target if explicit else getattr(args[0], TAG, None)
        elif func is torch.Tensor.cuda:
            origin = None
        else:
            origin = _inherited(args, kwargs)
            if origin is None:
                return result
        for tensor in _tensors(result):
            _tag(tensor, origin)
        return result

    def _backward(self, tensor, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        with self:  # torch.autograd.backward itself does not dispatch while the audit is active (see _install)
            return torch.autograd.backward(tensor, gradient, retain_graph, create_graph, inputs=inputs)


def _check(name: str, args: tuple, kwargs: dict) -> None:
    values = [*args, *kwargs.values()]
    ops = [v for v in values if isinstance(v, list) and v and isinstance(v[0], dist.P2POp)]
    tensors = [t for v in values for t in _tensors(v)] + [op.tensor for batch in ops for op in batch]
    for tensor in tensors:
        origin = getattr(tensor, TAG, None)
        if origin is not None:
            raise CollectiveDeviceError(
                f"{name} was given a {tuple(tensor.shape)} {tensor.dtype} tensor made without a device at {origin}: "
                "under nccl it would be a CPU tensor and the collective would fail; create it with "
                "device=<the rank's device> (or .to(device)), or device='cpu' for a gloo group of its own")
    group = kwargs.get("group")
    if tensors and dist.is_initialized() and dist.get_backend(group) == "nccl":
        for tensor in tensors:
            if tensor.device.type != "cuda":
                raise CollectiveDeviceError(f"{name} over nccl was given a tensor on {tensor.device}; nccl "
                                            "needs it on the rank's GPU")


def _checked(name: str, original):
    def collective(*args, **kwargs):
        _check(name, args, kwargs)
        return original(*args, **kwargs)

    collective.__wrapped__ = original
    collective.__name__ = name
    return collective


def _tagging_factory(original):
    def factory(*args, **kwargs):
        result = original(*args, **kwargs)
        _tag(result, _caller())
        return result

    factory.__wrapped__ = original
    return factory


class device_audit:  # lower case: used as a context manager, like torch.no_grad
    """``with device_audit():`` tags tensors made without a device and fails collectives that receive one.

    Not re-entrant; one per process at a time (the collective wrappers are process-wide)."""

    _active = False

    def __enter__(self) -> "device_audit":
        if device_audit._active:
            raise RuntimeError("device_audit is already active in this process")
        self._saved: list[tuple[Any, str, Any]] = []
        try:
            self._install()
        except BaseException:
            self._restore()
            raise
        device_audit._active = True
        return self

    def _install(self) -> None:
        from repro.dist import comm

        targets = [(dist, name) for name in _COLLECTIVES if hasattr(dist, name)]
        targets += [(comm, name) for name in ("_all_gather_single", "_reduce_scatter_single")]
        for module, name in targets:
            original = getattr(module, name)
            self._patch(module, name, _checked(getattr(original, "__name__", name), original))
        for name in ("from_numpy", "frombuffer"):  # plain C functions that torch function modes never see
            self._patch(torch, name, _tagging_factory(getattr(torch, name)))
        original_new = nn.Parameter.__new__

        def parameter(cls, data=None, requires_grad=True):  # a Parameter is a new tensor object around ``data``
            param = original_new(cls, data, requires_grad)
            if data is not None:
                _tag(param, getattr(data, TAG, None))
            return param

        self._patch(nn.Parameter, "__new__", parameter)
        # torch.autograd.backward/grad dispatch to the active mode, which would run the whole backward pass with
        # the mode popped; with the mode as the only torch-function handler, let them run under it instead.
        original_check = torch.autograd.has_torch_function
        self._patch(torch.autograd, "has_torch_function",
                    lambda args: original_check(args) and any(
                        type(a) not in (torch.Tensor, nn.Parameter) for a in args if isinstance(a, torch.Tensor)))
        self._mode = _Mode()
        self._mode.__enter__()

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING) if isinstance(owner, type)
                            else getattr(owner, name)))
        setattr(owner, name, value)

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        self._restore()
        device_audit._active = False

    def _restore(self) -> None:
        for owner, name, value in reversed(self._saved):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        self._saved.clear()


_MISSING = object()
