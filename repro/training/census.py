"""Count what a piece of training asks of the device: aten operations and host syncs, on any device, CPU included.

On a GPU nearly every aten operation that computes is one kernel launch (or a handful), and a few block the host
until the GPU has caught up: reading a value (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``) and operations
whose output shape depends on the data (``nonzero``, boolean indexing). A step's speed on a GPU depends on both:
every launch costs the host microseconds, and every sync drains the queue the GPU was working from. The CPU
dispatches the same operations, so a :class:`Census` taken here predicts the GPU step's launches and syncs without a
GPU (``tests/training/test_step_proxies.py``), and taken on a GPU it says where they come from (the ``perf`` plan of
``python -m repro.gpu_session``).

What counts: every aten operation that reaches the dispatcher, except views (their outputs alias an input: no
kernel), allocations of uninitialised memory (``empty``) and ``_unsafe_view``; a sync is one of :data:`SYNC_OPS` or a call of a
Python method that reads a tensor into the host (:data:`READ_METHODS`). Code that runs on the host's own data
before it moves to the device (a batch being cut and checked) can be left out with :meth:`Census.paused`; a
library call that is one fused kernel on a GPU (``torch.optim.AdamW.step`` with ``fused=True``) but many operations
on the CPU can be counted as one with ``as_one``.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: aten operations that block the host until the device has produced their input (by their overload packet name)
SYNC_OPS = frozenset({
    "aten._local_scalar_dense", "aten.is_nonzero", "aten.nonzero", "aten.masked_select", "aten.equal",
    "aten.allclose", "aten.unique_consecutive", "aten._unique", "aten._unique2", "aten.unique_dim",
})
#: Tensor methods that copy values to the host without going through a countable aten operation on the CPU
READ_METHODS = ("tolist", "numpy")
#: operations that launch no kernel: allocations without writing, and views whose schema does not say so
_NO_KERNEL = frozenset({"aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
                        "aten.new_empty_strided", "aten._unsafe_view"})


def _is_view(func: Any) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


class Census(TorchDispatchMode):
    """``with Census() as census: ...`` then ``census.ops`` (operations that compute), ``census.syncs`` (host syncs)
    and ``census.by_op`` / ``census.sync_sites`` (which ones). ``as_one`` is a list of ``(owner, method name)``
    whose calls each count as one operation, whatever they dispatch."""

    def __init__(self, *, as_one: tuple[tuple[Any, str], ...] = ()) -> None:
        super().__init__()
        self.by_op: Counter[str] = Counter()
        self.sync_sites: Counter[str] = Counter()
        self._paused = 0
        self._as_one = as_one
        self._patches: list[tuple[Any, str, Any]] = []

    @property
    def ops(self) -> int:
        return sum(self.by_op.values())

    @property
    def syncs(self) -> int:
        return sum(self.sync_sites.values())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing inside is counted (host-side work on host data)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._paused:
            name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
            if name in SYNC_OPS:
                self.sync_sites[name] += 1
            if not _is_view(func) and name not in _NO_KERNEL:
                self.by_op[name] += 1
        return func(*args, **(kwargs or {}))

    def _patch(self, owner: Any, attr: str, make) -> None:
        original = getattr(owner, attr)
        self._patches.append((owner, attr, original))
        setattr(owner, attr, make(original))

    def __enter__(self) -> "Census":
        def reading(original, name):
            @functools.wraps(original)
            def read(tensor, *args, **kwargs):
                if not self._paused:
                    self.sync_sites[f"Tensor.{name}"] += 1
                with self.paused():
                    return original(tensor, *args, **kwargs)
            return read

        def counted_once(original, name):
            @functools.wraps(original)
            def once(*args, **kwargs):
                if not self._paused:
                    self.by_op[name] += 1
                with self.paused():
                    return original(*args, **kwargs)
            return once

        for name in READ_METHODS:
            self._patch(torch.Tensor, name, lambda original, name=name: reading(original, name))
        for owner, attr in self._as_one:
            label = f"{getattr(owner, '__name__', owner)}.{attr}"
            self._patch(owner, attr, lambda original, label=label: counted_once(original, label))
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for owner, attr, original in reversed(self._patches):
                setattr(owner, attr, original)
            self._patches.clear()


GEMMS = frozenset({"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"})


@contextlib.contextmanager
def compiled_graphs() -> Iterator[list[dict]]:
    """Record each graph inductor compiles inside the block, after its own passes (what it turns into kernels):
    ``{"backward": bool, "gemms": [((m, k), (k, n)), ...], "ops": Counter of aten op names, "outputs": [(dtype,
    shape), ...]}`` per graph, in compile
    order; a backward graph is one that takes tangents, and a forward graph's outputs are its results followed by
    what it saves for backward. Inductor's caches are off inside, so every graph is compiled and seen."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    graphs: list[dict] = []

    def record(graph) -> None:
        nodes = list(graph.nodes)
        gemms = []
        for node in nodes:
            if node.op == "call_function" and str(getattr(node.target, "overloadpacket", "")) in GEMMS:
                shapes = [a.meta["val"].shape for a in node.args
                          if hasattr(a, "meta") and isinstance(a.meta.get("val"), torch.Tensor)]
                gemms.append(tuple(tuple(s) for s in shapes[-2:]))  # addmm's bias comes first
        backward = any(n.op == "placeholder" and n.name.startswith("tangents") for n in nodes)
        outputs = [a for n in nodes if n.op == "output" for a in torch.utils._pytree.tree_leaves(n.args)]
        values = [a.meta.get("val") for a in outputs if hasattr(a, "meta")]
        ops = Counter(str(node.target.overloadpacket) for node in nodes
                      if node.op == "call_function" and hasattr(node.target, "overloadpacket"))
        graphs.append({"backward": backward, "gemms": gemms, "ops": ops,
                       "outputs": [(v.dtype, tuple(v.shape)) for v in values if isinstance(v, torch.Tensor)]})

    try:  # torch >= 2.6 wants a CustomGraphPass (with a cache key); older ones take a callable
        from torch._inductor.custom_graph_pass import CustomGraphPass

        class _Record(CustomGraphPass):
            def __call__(self, graph) -> None:
                record(graph)

            def uuid(self) -> None:
                return None

        recorder: Any = _Record()
    except ImportError:
        recorder = record
    patches = {"post_grad_custom_post_pass": recorder, "fx_graph_cache": False}
    with contextlib.ExitStack() as stack:
        stack.enter_context(inductor_config.patch(patches))
        if hasattr(functorch_config, "enable_autograd_cache"):
            stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
        yield graphs
