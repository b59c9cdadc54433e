"""Before ``repro reproduce`` runs anything: which experiments need data the data directory does not hold.

The evaluation experiments read pinned files (WikiText-103, LAMBADA, RACE, the tokenizers) that are not part of the
repository; the rest need none. On a machine without them, the main job runs what needs no data and sets the others
aside with one line naming them and the ``repro data fetch`` that brings their data, instead of failing each of
their points on the same missing directory. Where a mirror is configured (``$REPRO_DATA_MIRROR``, as ``repro data
fetch`` reads it), the missing data sets are fetched from it first, checked as ``repro data fetch`` checks them.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from evals.fetch import MIRROR_ENV, FetchError, fetch, mirror_url
from repro.experiments.base import Experiment
from repro.text.data_files import default_data_dir, fetch_command, missing_datasets


def set_aside_for_data(experiments: Sequence[Experiment], *, say: Callable[[str], None]) -> dict[str, str]:
    """Experiment name -> why it is set aside, for those whose declared data sets (``Experiment.data``) are not all
    in the default data directory after fetching from ``$REPRO_DATA_MIRROR`` where one is set. Says one line when
    any is set aside (and one when a fetch was made)."""
    missing = {exp.name: missing_datasets(list(exp.data)) for exp in experiments if exp.data}
    missing = {name: sets for name, sets in missing.items() if sets}
    if not missing:
        return {}
    root = default_data_dir()[0]
    sets = sorted({name for names in missing.values() for name in names})
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    fetched = ""
    if mirror:
        try:
            root.mkdir(parents=True, exist_ok=True)
            fetch(sets, root, mirror=mirror_url(mirror), say=lambda message: None)
        except (FetchError, ValueError, OSError) as err:
            fetched = f" (the fetch from ${MIRROR_ENV} failed: {' '.join(str(err).split())[:200]})"
        else:
            say(f"data: fetched {', '.join(sets)} from ${MIRROR_ENV} ({mirror}) into {root}, each file checked "
                "against its pinned sha256")
            return {}
    command = fetch_command(None, sets)
    verb = "needs" if len(missing) == 1 else "need"
    say(f"data: {', '.join(missing)} {verb} {', '.join(sets)}, not in the data directory {root}{fetched}; they are "
        f"skipped (the rest runs): get the data with `{command}` (or set $REPRO_DATA, or ${MIRROR_ENV} to fetch "
        "it here)")
    return {name: f"needs {', '.join(names)} in the data directory ({fetch_command(None, names)})"
            for name, names in missing.items()}
