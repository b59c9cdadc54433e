"""Evaluation harnesses for the models of the Megatron-LM paper (Shoeybi et al. 2019, sec. 5 and App. E).

* WikiText-103 zero-shot perplexity: Megatron's overlapping windows, token and adjusted perplexity
  (:mod:`evals.wikitext`), and lm-eval's document-level word perplexity / bits per byte.
* LAMBADA cloze accuracy: strict, non-strict and lm-eval definitions (:mod:`evals.lambada`).
* RACE: finetuning with a multiple-choice head (:mod:`evals.race_finetune`) and lm-eval-style zero-shot scoring
  (:mod:`evals.race_zeroshot`).
* Checkpoints: repro's own (:mod:`evals.checkpoints`) and Hugging Face GPT-2 / BERT (:mod:`evals.hf_convert`).
* An lm-eval model adapter (:mod:`evals.lm_eval_adapter`) so lm-eval's tasks run on repro models.

Data is read from a local directory (``--data-dir`` / ``$REPRO_DATA``) and verified by sha256 before use.
Run ``python -m evals --help`` for the command line.
"""
