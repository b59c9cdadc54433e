"""An lm-eval model adapter, so EleutherAI lm-evaluation-harness tasks run on repro models.

lm-eval talks to a model through ``loglikelihood([(context, continuation)]) -> [(logprob, is_greedy)]`` and
``loglikelihood_rolling([(text,)]) -> [logprob]`` (DESIGN.md: "a model interface of loglikelihood /
loglikelihood_rolling"). :class:`ReproLM` implements both on any :class:`evals.scoring.CausalLM` with the same
tokenization conventions as lm-eval's causal Hugging Face model (trailing context spaces move to the continuation;
an empty context is replaced by the end-of-document token; rolling windows of context length 1).

lm-eval itself is an optional peer: it is imported only by :func:`as_lm_eval_model` (its evaluator requires a
subclass of ``lm_eval.api.model.LM``), :func:`local_task` and :func:`run_lm_eval`, never by the harnesses; where it
is missing they raise :class:`repro.optional.MissingPackage` (an ImportError) naming ``pip install lm-eval``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from evals.lambada import encode_pair
from evals.scoring import CausalLM, score_continuations
from repro.text.tokenization import TextTokenizer
from evals.wikitext import rolling_windows
from repro.optional import require
from repro.text.wikitext_articles import split_articles


class ReproLM:
    """``loglikelihood`` / ``loglikelihood_rolling`` over a :class:`CausalLM` (requests carry ``.args``)."""

    def __init__(self, model: CausalLM, tokenizer: TextTokenizer, *, batch_size: int = 16,
                 max_length: int | None = None, progress: bool = False) -> None:
        if tokenizer.eod_id is None:
            raise ValueError(f"tokenizer {tokenizer.name!r} has no end-of-document token; lm-eval needs one")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = batch_size
        self.max_length = max_length or model.max_length
        self.progress = progress

    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [encode_pair(*request.args, self.tokenizer) for request in requests]
        scores = score_continuations(self.model, pairs, batch_size=self.batch_size, pad_id=self.tokenizer.eod_id,
                                     desc="loglikelihood", progress=self.progress and not disable_tqdm)
        return [(s.logprob, s.is_greedy) for s in scores]

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for index, request in enumerate(requests):
            (text,) = request.args[:1]
            for window in rolling_windows(self.tokenizer.encode(text), self.max_length, self.tokenizer.eod_id):
                windows.append(window)
                owner.append(index)
        scores = score_continuations(self.model, windows, batch_size=self.batch_size, pad_id=self.tokenizer.eod_id,
                                     desc="loglikelihood_rolling", progress=self.progress and not disable_tqdm)
        totals = [0.0] * len(requests)
        for index, score in zip(owner, scores):
            totals[index] += score.logprob
        return totals

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError("ReproLM scores text; generation tasks (generate_until) are not supported")


def as_lm_eval_model(model: CausalLM, tokenizer: TextTokenizer, **kwargs: Any):
    """A :class:`ReproLM` that is also an ``lm_eval.api.model.LM``, for ``lm_eval.simple_evaluate(model=...)``."""
    LM = require("lm_eval.api.model", "running an lm-eval task on a repro model").LM

    class ReproLMEval(ReproLM, LM):
        def __init__(self) -> None:
            LM.__init__(self)
            ReproLM.__init__(self, model, tokenizer, **kwargs)

    return ReproLMEval()


# Overrides that point an lm-eval task at a local JSONL file instead of the Hugging Face hub.
def local_task(task_name: str, jsonl_path: str | Path):
    """lm-eval's own task definition (its YAML and preprocessing functions, as installed) reading ``jsonl_path``.

    ``task_name`` is ``"wikitext"``, ``"lambada_openai"`` or ``"race"``; the JSONL holds the documents in the
    columns the task expects (page / text / article + problems). Returns an ``lm_eval`` ``ConfigurableTask``.
    """
    lm_eval = require("lm_eval", f"lm-eval's {task_name} task")
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks._yaml_loader import load_yaml

    folders = {"wikitext": "wikitext/wikitext.yaml", "lambada_openai": "lambada/lambada_openai.yaml",
               "race": "race/race.yaml"}
    if task_name not in folders:
        raise ValueError(f"task {task_name!r} is not one of {sorted(folders)}")
    config = load_yaml(Path(lm_eval.__file__).parent / "tasks" / folders[task_name])
    config.update(
        task=f"repro_local_{task_name}", dataset_path="json", dataset_name=None,
        dataset_kwargs={"data_files": {"test": str(jsonl_path)}}, test_split="test",
        training_split=None, validation_split=None, fewshot_split=None,
    )
    config.pop("tag", None)
    return ConfigurableTask(config=config)


def run_lm_eval(lm, tasks: Sequence[Any], *, bootstrap_iters: int = 0) -> dict[str, dict[str, Any]]:
    """Run lm-eval's evaluator (zero-shot; standard errors only with ``bootstrap_iters`` > 0, as lm-eval's own
    setting) on ``tasks``; returns its per-task metrics."""
    evaluate = require("lm_eval.evaluator", "lm-eval's evaluator").evaluate

    # a plain {name: task} dict: lm-eval's TaskManager would index every YAML it ships (tens of seconds)
    task_dict = {task.config.task: task for task in tasks}
    output = evaluate(lm=lm, task_dict=task_dict, bootstrap_iters=bootstrap_iters, log_samples=False,
                      verbosity="ERROR")
    return output["results"]


def measure_with_lm_eval(model: CausalLM, tokenizer: TextTokenizer, *, lambada_texts: Sequence[str],
                         wikitext_pages: Sequence[str], workdir: str | Path, batch_size: int = 16
                         ) -> dict[tuple[str, str, str], float]:
    """lm-eval's ``lambada_openai`` and ``wikitext`` tasks, as lm-eval defines and aggregates them, on ``model``
    (through :func:`as_lm_eval_model`); keys as in :mod:`evals.reconcile` (accuracy in %)."""
    import json

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "lambada.jsonl", "w") as handle:
        for text in lambada_texts:
            handle.write(json.dumps({"text": text}) + "\n")
    with open(workdir / "wikitext.jsonl", "w") as handle:
        for page in wikitext_pages:
            handle.write(json.dumps({"page": page}) + "\n")
    lm = as_lm_eval_model(model, tokenizer, batch_size=batch_size)
    results = run_lm_eval(lm, [local_task("lambada_openai", workdir / "lambada.jsonl"),
                               local_task("wikitext", workdir / "wikitext.jsonl")])
    lam, wiki = results["repro_local_lambada_openai"], results["repro_local_wikitext"]
    return {
        ("lambada", "accuracy", "lm_eval"): 100.0 * lam["acc,none"],
        ("lambada", "last_word_perplexity", "lm_eval"): lam["perplexity,none"],
        ("wikitext103", "word_perplexity", "lm_eval"): wiki["word_perplexity,none"],
        ("wikitext103", "bits_per_byte", "lm_eval"): wiki["bits_per_byte,none"],
        ("wikitext103", "byte_perplexity", "lm_eval"): wiki["byte_perplexity,none"],
    }


def lm_eval_measure(checkpoint: str, data_dir, limit, seq_len, batch_size) -> dict:
    """lm-eval's own LAMBADA and WikiText numbers for a checkpoint (the first ``limit`` records of each)."""
    import tempfile

    from evals.loaders import load_lambada, load_wikitext
    from evals.model_builders import load_gpt_for_eval
    from repro.text.tokenization import gpt2_tokenizer

    tokenizer = gpt2_tokenizer(data_dir)
    model, _ = load_gpt_for_eval(checkpoint, tokenizer, max_length=seq_len)
    pages = split_articles(load_wikitext("test", data_dir).records)[:limit]
    with tempfile.TemporaryDirectory() as workdir:
        return measure_with_lm_eval(model, tokenizer, lambada_texts=load_lambada(data_dir).records[:limit],
                                    wikitext_pages=pages, workdir=workdir, batch_size=batch_size)
