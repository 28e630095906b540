"""Every "mean ± std" accuracy in README.md and docs/results.md is one that a generated
result file under docs/results/ holds (a report's results.csv, gaps.csv or diagnostics.csv,
rounded as the page shows it): a table or sentence that quotes a run set measured again
since cannot keep the old figure unseen. Figures kept on purpose from a measurement whose
runs are gone are listed below, each with why."""

from __future__ import annotations

import csv
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "results.md"]
FIGURE = re.compile(r"(?<![\d.])(\d+\.\d\d) ± (\d+\.\d\d)")
#: Figures that name an earlier measurement, not a file of today's runs.
HISTORICAL = {
    "40.93 ± 41.05": "FedMR at deco = 4 before the float64 average fix (its runs were measured again since)",
    "6.14 ± 7.75": "the Fashion-MNIST CNN's FedVLS - FedAvg gap before the float64 average fix (measured again since)",
}


@cache
def measured() -> frozenset[tuple[str, str]]:
    """(|mean|, std) to two decimals, for every column pair X_mean / X_std (best, final, a gap's
    mean / std, a diagnostic) of every CSV under docs/results/."""
    found = set()
    for path in (ROOT / "docs" / "results").rglob("*.csv"):
        with path.open() as f:
            for row in csv.DictReader(f):
                for key, value in row.items():
                    if key is None or not key.endswith("mean") or not value:
                        continue
                    std = row.get(key[: -len("mean")] + "std")
                    try:
                        found.add((f"{abs(float(value)):.2f}", f"{float(std):.2f}"))
                    except (TypeError, ValueError):
                        continue
    return frozenset(found)


def _quoted() -> list[tuple[str, str]]:
    return [(f"{page.name}:{n}", m.group(0)) for page in PAGES for n, line in enumerate(page.read_text().splitlines(), 1)
            for m in FIGURE.finditer(line)]


def test_the_pages_quote_figures():
    assert len(_quoted()) > 100 and len(measured()) > 100


@pytest.mark.parametrize(("where", "figure"), _quoted())
def test_every_quoted_figure_is_in_a_result_file(where, figure):
    if figure in HISTORICAL:
        return
    mean, std = FIGURE.fullmatch(figure).groups()
    assert (mean, std) in measured(), (
        f"{where}: {figure} is in no CSV under docs/results/ - the runs it quotes were measured again (copy the "
        "figure from the regenerated report), or, if it names an earlier measurement on purpose, add it to HISTORICAL")


def test_the_readme_results_table_quotes_measured_means():
    """README's headline table gives means without their std: each one is a report's best mean."""
    means = set()
    for path in (ROOT / "docs" / "results").rglob("results.csv"):
        with path.open() as f:
            means |= {f"{float(row['best_mean']):.2f}" for row in csv.DictReader(f) if row.get("best_mean")}
    text = (ROOT / "README.md").read_text()
    start = text.index("| top-1 % | FedAvg")
    rows = [line for line in text[start:text.index("\n\n", start)].splitlines()[2:] if not line.startswith("| paper")]
    assert len(rows) >= 3
    for row in rows:
        cells = re.sub(r"± \d+\.\d\d", "", "|".join(row.split("|")[2:]))  # the first cell names the betas
        stale = [n for n in re.findall(r"(?<![\d.])\d+\.\d\d(?![\d])", cells) if n not in means]
        assert not stale, f"README.md's results row {row[:40]!r}: {stale} is no best mean of any results.csv under docs/results/"


def test_historical_figures_are_still_quoted():
    quoted = {figure for _, figure in _quoted()}
    assert set(HISTORICAL) <= quoted, "a HISTORICAL figure no page quotes any more: remove it from the list"
