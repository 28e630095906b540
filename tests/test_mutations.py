"""The mutation harness stays usable and its table stays true: every mutation of
scripts/mutations.py still applies to the code (its text once in its file), names tests that
exist, and docs/reliability.md shows a row for each, every one killed. Running the mutations
is slow and kept out of CI: `python scripts/mutation_harness.py --only NAME` measures a row."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.mutation_harness import apply, read_rows
from scripts.mutations import MUTATIONS
from scripts.reliability_table import split_row

ROOT = Path(__file__).resolve().parents[1]


def test_names_are_unique_and_every_area_has_a_mutation():
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)
    assert {"objectives", "aggregation", "partitioning", "sampling", "round rules", "checkpoint and resume",
            "reply checks", "fence config"} <= {m.area for m in MUTATIONS}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_a_mutation_applies_once_and_names_existing_tests(mutation, tmp_path):
    target = tmp_path / mutation.file
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text((ROOT / mutation.file).read_text())
    original = apply(mutation, tmp_path)
    assert target.read_text() != original
    assert mutation.tests and all((ROOT / t.split("::")[0]).is_file() for t in mutation.tests)


def test_the_page_shows_every_mutation_killed():
    rows = read_rows()
    assert sorted(rows) == sorted(m.name for m in MUTATIONS), \
        "measure the missing rows: .venv/bin/python scripts/mutation_harness.py --only NAME"
    survived = [name for name, line in rows.items() if split_row(line)[5] != "killed"]
    assert survived == [], f"mutations not killed on docs/reliability.md: {survived}"
