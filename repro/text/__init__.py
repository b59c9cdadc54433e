"""Text data and tokenizers below both the trainer and the evaluation harness: the pinned data files and their
checksums (:mod:`~repro.text.data_files`), GPT-2's byte-level BPE and BERT's WordPiece built from the pinned
vocabularies (:mod:`~repro.text.tokenization`), WikiText's detokenizer (:mod:`~repro.text.detokenize`) and its
article boundaries (:mod:`~repro.text.wikitext_articles`)."""
