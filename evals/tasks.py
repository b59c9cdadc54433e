"""Named evaluations over a checkpoint, returning result rows: what the CLI, the experiments and the toy run call.

Each zero-shot task is one :class:`~evals.task_record.Task` record in :data:`TASKS` (name, command, help, its own
options as :class:`~evals.task_record.Option` records, the function that scores, an optional check against the model);
the CLI's commands, :class:`EvalSpec`'s options and the rows' ``settings`` are built from the records, so adding a task
is one record here and its scoring function.

Every task builds its model on the caller's tensor-parallel group (``tp_group``); :func:`run_at_tp` spawns ``tp``
local processes (gloo) and returns rank 0's rows, so the same checkpoint can be evaluated at any tp size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from evals.task_record import Option, Task
from repro.cliargs import int_at_least, positive_int

if TYPE_CHECKING:
    from repro.models import GPTConfig
    from repro.dist.comm import CommGroup

#: the shortest WikiText prefix (--max-tokens): a perplexity scores every token after the first
MIN_WIKITEXT_TOKENS = 2
WIKITEXT_TOKENS_WHY = "a perplexity scores the tokens after the first, so it needs two"

#: the model options a row's ``settings`` name, before the task's own
SETTINGS = ("task", "tp", "seq_len", "batch_size", "limit", "bootstrap_iters")

# The scoring functions import the harness (torch, the data loaders) when they run: the records are read by
# ``python -m evals --help``, which should not wait for torch.


@dataclass(frozen=True)
class EvalSpec:
    """One evaluation: the model options every task takes, and in :attr:`options` the task's own (by
    :attr:`Option.name`; a missing one takes its default, one the task does not take is refused). ``limit`` keeps
    the first N examples (LAMBADA passages, WikiText articles, RACE articles)."""

    task: str
    checkpoint: str
    data_dir: str | None = None
    tp: int = 1
    seq_len: int | None = None  # default: the model's max_position_embeddings
    batch_size: int = 8
    limit: int | None = None
    progress: bool = True
    bootstrap_iters: int = 100_000  # lm-eval's: resamples for a perplexity's standard error (0: no stderr at all)
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r} is not one of {tuple(TASKS)}")
        for name in ("tp", "batch_size", "seq_len", "limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value} must be >= 1")
        if self.bootstrap_iters < 0:
            raise ValueError(f"bootstrap_iters={self.bootstrap_iters} must be >= 0")
        own = {option.name: option for option in TASKS[self.task].options}
        unknown = sorted(set(self.options) - set(own))
        if unknown:
            raise ValueError(f"task {self.task!r} takes no option {unknown[0]!r} (its own: {tuple(own)})")
        # frozen: the checked values (defaults filled in) replace the given mapping once, here (a plain dict: a spec
        # travels to tp > 1 ranks pickled)
        checked = {name: option.checked(self.options.get(name, option.default)) for name, option in own.items()}
        object.__setattr__(self, "options", checked)

    def __getitem__(self, name: str) -> Any:
        """The value of the task's own option ``name`` (``spec["stride"]``)."""
        return self.options[name]


def row_settings(spec: EvalSpec, **extra: Any) -> dict[str, Any]:
    """A row's ``settings``: the model options, then the task's own (an option of several values as a list)."""
    settings: dict[str, Any] = {name: getattr(spec, name) for name in SETTINGS}
    settings.update({name: list(value) if isinstance(value, tuple) else value for name, value in spec.options.items()})
    settings.update(extra)
    return settings


def _accuracy_stderr(correct, spec: EvalSpec) -> float | None:
    """lm-eval's ``mean_stderr`` of per-example 0/1 scores (none with ``bootstrap_iters`` 0, as lm-eval)."""
    from evals.stderr import mean_stderr

    return mean_stderr([float(c) for c in correct]) if spec.bootstrap_iters > 0 else None


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction


def _wikitext(spec: EvalSpec, model, tokenizer, common: dict[str, Any]) -> list[dict[str, Any]]:
    """Megatron's token and adjusted perplexity (overlapping windows), lm-eval's word/byte perplexity per article;
    no standard errors, as lm-eval computes none for a weighted perplexity or bits per byte."""
    from evals import wikitext as wikitext_mod
    from evals.records import row
    from evals.loaders import load_wikitext
    from repro.text.wikitext_articles import split_articles

    seq_len = spec.seq_len or model.max_length
    loaded_text = load_wikitext(spec["split"], spec.data_dir)
    text = loaded_text.records
    window = wikitext_mod.WindowConfig(seq_len=seq_len, stride=spec["stride"])
    meg = wikitext_mod.evaluate_megatron(model, tokenizer, text, window, batch_size=spec.batch_size,
                                         progress=spec.progress, max_tokens=spec["max_tokens"])
    articles = split_articles(text)[: spec.limit]
    doc = wikitext_mod.evaluate_documents(model, tokenizer, articles, max_length=seq_len,
                                          batch_size=spec.batch_size, progress=spec.progress)
    kw = dict(task="wikitext103", data_sha256=loaded_text.data_sha256, settings=row_settings(spec, seq_len=seq_len),
              **common)
    return [
        row("token_perplexity", meg.token_perplexity, "perplexity", definition="megatron_token", **kw),
        row("adjusted_perplexity", meg.adjusted_perplexity, "perplexity", definition="megatron_adjusted", **kw),
        row("bpe_tokens", meg.num_tokenized, "count", definition="megatron_token", **kw),
        row("original_tokens", meg.num_original, "count", definition="megatron_adjusted", **kw),
        row("word_perplexity", doc.word_perplexity, "perplexity", definition="lm_eval", **kw),
        row("byte_perplexity", doc.byte_perplexity, "perplexity", definition="lm_eval", **kw),
        row("bits_per_byte", doc.bits_per_byte, "bits/byte", definition="lm_eval", **kw),
        row("words", doc.num_words, "count", definition="lm_eval", **kw),
    ]


def _lambada(spec: EvalSpec, model, tokenizer, common: dict[str, Any]) -> list[dict[str, Any]]:
    """Accuracy and last-word perplexity under the strict, non-strict and lm-eval definitions."""
    from evals import lambada as lambada_mod
    from evals.records import row
    from evals.loaders import load_lambada
    from evals.stderr import perplexity_stderrs

    loaded_text = load_lambada(spec.data_dir)
    results = lambada_mod.evaluate_lambada(model, tokenizer, loaded_text.records[: spec.limit],
                                           batch_size=spec.batch_size, progress=spec.progress)
    kw = dict(task="lambada", data_sha256=loaded_text.data_sha256, settings=row_settings(spec), **common)
    rows: list[dict[str, Any]] = []
    perplexity_errors = perplexity_stderrs([r.logprobs for r in results.values()], iters=spec.bootstrap_iters)
    for (definition, result), perplexity_error in zip(results.items(), perplexity_errors):
        rows += [
            row("accuracy", 100.0 * result.accuracy, "%", definition=definition,
                stderr=_percent(_accuracy_stderr(result.correct, spec)), **kw),
            row("last_word_perplexity", result.perplexity, "perplexity", definition=definition,
                stderr=perplexity_error, **kw),
            row("examples", result.num_examples, "count", definition=definition, **kw),
        ]
    return rows


def _race_zeroshot(spec: EvalSpec, model, tokenizer, common: dict[str, Any]) -> list[dict[str, Any]]:
    """lm-eval's race task: accuracy per level and overall, documents counted."""
    from evals.loaders import load_race
    from evals.records import row
    from evals.race_zeroshot import documents_of, evaluate_race_zeroshot

    docs, shas = [], []
    for level in spec["levels"]:
        loaded_race = load_race(spec["split"], level, spec.data_dir)
        docs += documents_of(loaded_race.records, level)[: spec.limit]
        shas.append(loaded_race.data_sha256)
    result = evaluate_race_zeroshot(model, tokenizer, docs, batch_size=spec.batch_size, progress=spec.progress)
    kw = dict(task="race", data_sha256=",".join(shas), settings=row_settings(spec), **common)
    rows = [row("accuracy", 100.0 * result.accuracy(level), "%", definition=f"lm_eval_zeroshot_{level}",
                stderr=_percent(_accuracy_stderr(result.correct(level), spec)), **kw)
            for level in (*spec["levels"], "all")]
    return rows + [row("documents", len(docs), "count", definition="lm_eval_zeroshot_all", **kw)]


def _check_window(spec: EvalSpec, config: GPTConfig) -> None:
    """WikiText's stride within the window the model reads."""
    from evals.wikitext import WindowConfig

    WindowConfig(seq_len=spec.seq_len or config.max_position_embeddings, stride=spec["stride"])


#: every zero-shot task, by name, in the order ``python -m evals --help`` lists their commands
TASKS: dict[str, Task] = {task.name: task for task in (
    Task("wikitext", "wikitext", "WikiText-103 perplexity: Megatron token/adjusted and lm-eval word/bpb", _wikitext,
         options=(Option("stride", 32, "new tokens scored per window (Megatron --overlapping-eval; the paper's 32)",
                         parse=positive_int, minimum=1),
                  Option("max_tokens", None, f"keep a BPE prefix of the test stream, N >= {MIN_WIKITEXT_TOKENS} "
                                             "(default: the whole stream)",
                         parse=int_at_least(MIN_WIKITEXT_TOKENS, WIKITEXT_TOKENS_WHY), minimum=MIN_WIKITEXT_TOKENS,
                         why=WIKITEXT_TOKENS_WHY),
                  Option("split", "test", "WikiText-103 split to score", choices=("test", "valid"))),
         check=_check_window),
    Task("lambada", "lambada", "LAMBADA accuracy (strict, non-strict, lm-eval) and last-word perplexity", _lambada),
    Task("race_zeroshot", "race-zeroshot", "RACE zero-shot accuracy, lm-eval's race task definition",
         _race_zeroshot,
         options=(Option("split", "test", "RACE split to score", choices=("test", "dev")),
                  Option("levels", ("middle", "high"), "lm-eval's task is high only", choices=("middle", "high"),
                         many=True))),
)}


def task_of_command(command: str) -> Task | None:
    """The task a ``python -m evals`` command runs (None for the other commands)."""
    return next((task for task in TASKS.values() if task.command == command), None)


def check_settings(spec: EvalSpec, config: GPTConfig) -> None:
    """The settings of ``spec`` against the model's ``config`` (ValueError naming the value): ``seq_len`` within the
    model's positions, whole heads per tp rank, then the task's own :attr:`Task.check`."""
    if spec.seq_len is not None and spec.seq_len > config.max_position_embeddings:
        raise ValueError(f"seq_len={spec.seq_len} exceeds the model's max_length={config.max_position_embeddings}")
    config.check_tensor_parallel(spec.tp)
    check = TASKS[spec.task].check
    if check is not None:
        check(spec, config)


def gpt_config_of(checkpoint: str) -> GPTConfig:
    """The GPT config of ``checkpoint``, refused as :func:`run_eval` would refuse it: a repro checkpoint's header is
    read alone; any other format (or a repro header that a load would refuse) is loaded once."""
    from pathlib import Path

    from evals.checkpoint_formats import checkpoint_format, load_checkpoint
    from evals.checkpoints import read_header
    from repro.models import GPTConfig

    if checkpoint_format(checkpoint) == "repro":
        header = read_header(checkpoint)
        if header["architecture"] == "gpt" and all((Path(checkpoint) / f).is_file() for f in header["files"]):
            return GPTConfig(**header["config"])
    return load_checkpoint(checkpoint, expect="gpt").config


def check_spec(spec: EvalSpec) -> None:
    """Every refusal a tp > 1 run's ranks would meet before scoring, met here once, in the calling process: the
    tokenizer files, the checkpoint (format, architecture, vocabulary) and :func:`check_settings`."""
    from repro.text.tokenization import check_vocab_compatible, gpt2_tokenizer

    tokenizer = gpt2_tokenizer(spec.data_dir)
    config = gpt_config_of(spec.checkpoint)
    check_vocab_compatible(tokenizer, config.vocab_size)
    check_settings(spec, config)


def run_eval(spec: EvalSpec, *, tp_group: CommGroup | None = None) -> list[dict[str, Any]]:
    """Build the model of ``spec.checkpoint`` on ``tp_group`` and run its task's :attr:`Task.evaluate`; the model
    reads at most ``spec.seq_len`` tokens (default: its positions), LAMBADA's and RACE's contexts cut on the left
    as lm-eval's ``max_length`` does."""
    from evals.model_builders import load_gpt_for_eval
    from evals.repro_lm import ReproCausalLM
    from repro.text.tokenization import gpt2_tokenizer

    tokenizer = gpt2_tokenizer(spec.data_dir)
    model, loaded = load_gpt_for_eval(spec.checkpoint, tokenizer, tp_group=tp_group)
    check_settings(spec, loaded.config)
    if spec.seq_len is not None:
        model = ReproCausalLM(model.model, max_length=spec.seq_len)
    common = {"model": f"{loaded.source}:{spec.checkpoint}", "checkpoint_sha256": loaded.sha256}
    return TASKS[spec.task].evaluate(spec, model, tokenizer, common)


def _rank_main(rank: int, world_size: int, spec: EvalSpec) -> list[dict[str, Any]]:
    from repro.dist import init_parallel

    groups = init_parallel(tp=world_size)
    return run_eval(dataclasses.replace(spec, progress=spec.progress and rank == 0), tp_group=groups.tp)


def run_at_tp(spec: EvalSpec, *, timeout_s: float = 3600.0) -> list[dict[str, Any]]:
    """Run ``spec`` in-process at tp=1, or on ``spec.tp`` spawned processes (rank 0's rows are returned)."""
    if spec.tp == 1:
        return run_eval(spec)
    check_spec(spec)  # one line here, not a rank's traceback after spawning tp processes
    from repro.dist import spawn

    return spawn(_rank_main, spec.tp, spec, timeout_s=timeout_s)[0]
