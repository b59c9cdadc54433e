"""The floors of repro and evals, as data: every import points down (or stays on its floor), except the few arrows
listed below, each with the reason it exists and where it should go. DESIGN.md's rule "no import cycles" says no
two modules lean on each other; this says which way a module may lean at all. A new arrow up fails here: move the
shared piece down instead, or, if it is deliberate, add it to ``UP`` with its reason.

Every import counts, at module level or inside a function (tests/foundation/test_import_cycles.py's graph)."""

from __future__ import annotations

from tests.foundation.test_import_cycles import _graph

#: bottom to top; a unit is a top-level module or package of repro, or evals
FLOORS: tuple[tuple[str, ...], ...] = (
    ("repro.optional", "repro.paths", "repro.machine", "repro.atomic_files", "repro.cliargs", "repro.timing",
     "repro.claims_scope", "repro.gpu_plans", "repro.vocabulary"),                # the ground: no repro imports
    ("repro.dist",),                                                              # process groups and collectives
    ("repro.tensor_parallel",),                                                   # Megatron's layers and mappings
    ("repro.zero",),                                                              # ZeRO, for any nn.Module
    ("repro.models",),                                                            # GPT and BERT
    ("repro.perfmodel", "repro.pipeline", "repro.gna", "repro.overlap"),          # models of cost, the systems
    ("repro.results", "repro.paper", "repro.assets"),                             # rows on disk, paper values
    ("repro.training",),                                                          # the trainer
    ("evals",),                                                                   # the evaluation harnesses
    ("repro.claims", "repro.claims_render", "repro.cross_hardware"),              # verdicts
    ("repro.experiments", "repro.figures"),                                       # experiments and figures
    ("repro.harness",),                                                           # what runs the experiments
    ("repro.cli", "repro.gpu_session", "repro.__main__", "repro.testing"),        # entry points
)

#: the arrows that point up today, module to module, and why (each is a debt, not a design)
UP: dict[tuple[str, str], str] = {
    **{("repro.training.corpus", f"evals.{name}"): "the corpus tool tokenizes with the harness's GPT-2 tokenizer "
       "and reads WikiText the harness's way; both belong below the trainer"
       for name in ("data_files", "detokenize", "tokenization", "wikitext")},
    ("repro.zero.measure", "repro.training.data"): "ZeRO's measuring harness draws the trainer's synthetic batches; "
                                                   "the harness belongs in experiments or bench",
    **{("repro.zero.construction", f"repro.models.{name}"): "ZeRO-3's construction-time partitioning knows the GPT's "
       "embedding and layer classes; it should take them as arguments" for name in ("embedding", "transformer")},
    ("repro.zero.partitioned_gpt", "repro.models.gpt"): "a GPT built under ZeRO-3 for the experiments: it belongs "
                                                       "beside them",
    **{("repro.zero.stage3", f"repro.models.{name}"): "ZeRO-3 names the GPT and BERT modules whose parameters it "
       "gathers together; a list of block classes should come from the caller" for name in ("bert", "gpt")},
    **{("repro.zero.residual_model", f"repro.perfmodel.{name}"): "the residual-memory model of ZeRO's measurements "
       "uses perfmodel's closed forms: it belongs in perfmodel"
       for name in ("flops", "parallel_comm", "zero_infinity")},
}


def _unit(module: str) -> str:
    parts = module.split(".")
    return "evals" if parts[0] == "evals" else f"repro.{parts[1]}"


def test_every_import_points_down_or_is_listed():
    floor = {unit: level for level, units in enumerate(FLOORS) for unit in units}
    graph = _graph()
    unplaced = sorted({_unit(m) for m in graph} - set(floor))
    assert not unplaced, f"modules on no floor (add them to FLOORS): {unplaced}"
    up = {(a, b) for a, targets in graph.items() for b in targets if floor[_unit(b)] > floor[_unit(a)]}
    new = sorted(up - set(UP))
    assert not new, "imports that point up a floor:\n" + "\n".join(f"{a} -> {b}" for a, b in new)
    gone = sorted(set(UP) - up)
    assert not gone, "listed arrows that no longer exist (remove them from UP):\n" + "\n".join(
        f"{a} -> {b}" for a, b in gone)
