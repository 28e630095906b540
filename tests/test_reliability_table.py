"""docs/reliability.md is measured, not written: every case of scripts/reliability_cases.py
has its row, and the fast (check-level) cases still give the exit code and the message the
page shows. A changed message fails here; `python scripts/reliability_table.py --fast`
(or `--only ID`) measures the rows again."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.reliability_cases import CASES, FAULTS, Case
from scripts.reliability_table import PAGE, documented, read_rows, run_case

FAST = [c for c in CASES if c.fast]
RERUN = "measure it again: .venv/bin/python scripts/reliability_table.py --only {id}"


def test_every_case_has_its_row_on_the_page():
    shown = documented()
    assert [c.id for c in CASES if c.id not in shown] == [], "cases missing from docs/reliability.md"
    assert sorted(set(shown) - {c.id for c in CASES}) == [], "rows without a case"
    assert len({c.id for c in CASES}) == len(CASES) and len({f.id for f in FAULTS}) == len(FAULTS)
    assert sorted(read_rows("faults")) == sorted(f.id for f in FAULTS), "fault rows differ from FAULTS"
    assert len(FAST) >= 50


@pytest.mark.parametrize("case", FAST, ids=[c.id for c in FAST])
def test_a_fast_case_still_says_what_the_page_says(case, tmp_path: Path):
    exit_code, message = documented()[case.id]
    result = run_case(case, tmp_path)
    assert (result.exit, result.message) == (exit_code, message), RERUN.format(id=case.id)
    assert not result.traceback


def test_the_page_stands_on_its_own():
    text = PAGE.read_text()
    assert text.startswith("# Reliability") and "## Measuring again" in text
    assert "<!-- inputs table" in text and "<!-- faults table" in text


def test_a_case_keeps_its_temporary_folders_in_its_own(tmp_path: Path):
    """A command's temporary folders (``deploy local``'s default work folder, ``tempfile.mkdtemp()``)
    go to the case's folder, removed after the case: measuring the page left a /tmp/fedvls-deploy-*
    of every deployment it ran."""
    made = "import tempfile; print('made', tempfile.mkdtemp(prefix='fedvls-probe-'))"
    result = run_case(Case("probe", "a temporary folder", ("-c", made), pick="^made "), tmp_path)
    assert result.exit == 0 and result.message.startswith("made <tmp>/fedvls-probe-"), result.message
