#!/usr/bin/env python
"""Turn ``../shared/paper_claims.csv`` into the paper reference tables under ``results/paper/``.

Writes ``results/paper/paper_claims.csv`` (every claim, plus ``value_num`` and ``table``) and one file per paper
table or figure, ``results/paper/<paper>/<table>.csv`` (e.g. ``zero_2019/table_1.csv``), so a reader can open
"ZeRO Table 1" directly. Usage: ``python scripts/paper_tables.py [path/to/paper_claims.csv]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from repro.paper import CLAIMS_FILE, PAPER_DIR, SHARED_CLAIMS, tidy


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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
