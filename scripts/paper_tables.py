#!/usr/bin/env python
"""Turn ``../shared/paper_claims.csv`` into the paper reference tables under ``results/paper/``.

Writes ``results/paper/paper_claims.csv`` (every claim, plus ``value_num`` and ``table``) and one file per paper
table or figure, ``results/paper/<paper>/<table>.csv`` (e.g. ``zero_2019/table_1.csv``), so a reader can open
"ZeRO Table 1" directly. Usage: ``python scripts/paper_tables.py [path/to/paper_claims.csv]``.

The suite's own derived claims (``results/paper/derived_claims.csv``, e.g. the ordering of Megatron-LM's Table 3)
are kept apart from this copy and never written here; after writing, the table is loaded with them once, so that a
new shared table whose ids clash with a derived claim is refused at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from repro.paper import CLAIMS_FILE, DERIVED_FILE, PAPER_DIR, SHARED_CLAIMS, load_claims, tidy


def write_tables(source: Path, out_dir: Path) -> list[Path]:
    raw = pd.read_csv(source, dtype={"value": str}, keep_default_na=False, na_values=[""])
    claims = tidy(raw)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / CLAIMS_FILE.name]
    claims.to_csv(written[0], index=False)
    for (paper, table), group in claims.groupby(["paper", "table"], sort=True):
        path = out_dir / paper / f"{table}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        group.drop(columns=["paper", "table"]).to_csv(path, index=False)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    source = Path(argv[1]) if len(argv) > 1 else SHARED_CLAIMS
    if not source.exists():
        print(f"paper_tables.py: no claims table at {source}", file=sys.stderr)
        return 2
    written = write_tables(source, PAPER_DIR)
    print(f"wrote {len(written)} files under {PAPER_DIR} from {source}")
    try:
        claims = load_claims()  # the copy and the derived claims, as the report reads them
    except ValueError as err:
        print(f"paper_tables.py: {err} (with {DERIVED_FILE})", file=sys.stderr)
        return 1
    derived = int((claims["verbatim_or_derived"] == "derived").sum())
    print(f"{len(claims)} claims with {DERIVED_FILE.name} ({derived} derived in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
