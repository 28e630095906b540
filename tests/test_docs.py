"""The docs name only what exists: every run-config / node-config / federation key in a
command line of README.md or docs/*.md is a real key, and every flag given to a
``fedvls`` command, a ``python -m fedvls_flwr`` command or a script in ``bench/`` and
``scripts/`` is one that command accepts (its ``--help`` lists it); every relative link and
anchor resolves; docs/README.md lists every page of docs/, and README.md links it."""

import contextlib
import io
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from fedvls_flwr import cli
from fedvls_flwr.config.run_config import FEDERATION_KEYS, SETTINGS
from fedvls_flwr.data.node_config import NODE_CONFIG_KEYS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIG_OPTIONS = {
    "--run-config": {s.key for s in SETTINGS},
    "--node-config": set(NODE_CONFIG_KEYS),
    "--federation-config": set(FEDERATION_KEYS),
}
ARGUMENT = re.compile(r"""(--[a-z-]+-config|--set)[ =](?:"([^"]*)"|'([^']*)')""")
KEY = re.compile(r"(?:^|\s)([a-z][a-z0-9-]*)=")
PLACEHOLDERS = {"key", "key2", "k1", "k2"}  # the syntax explained, not a setting


def _command_lines() -> list[tuple[str, str]]:
    """(where, line) for every line of a code block, and every inline `code` span, joined
    over backslash continuations."""
    out = []
    for path in DOCS:
        text = path.read_text()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
        spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        for chunk in [*blocks, *spans]:
            for line in chunk.replace("\\\n", " ").splitlines():
                out.append((path.name, line.split(" #")[0].strip()))
    return out


LINES = _command_lines()


def _config_strings() -> list[tuple[str, str, str]]:
    return [(where, m.group(1), m.group(2) if m.group(2) is not None else m.group(3))
            for where, line in LINES for m in ARGUMENT.finditer(line)]


@pytest.mark.parametrize(("where", "option", "value"), _config_strings(), ids=lambda v: str(v)[:60])
def test_config_keys_in_the_docs_exist(where, option, value):
    allowed = CONFIG_OPTIONS.get(option, CONFIG_OPTIONS["--run-config"])  # --set takes run-config keys
    unknown = [k for k in KEY.findall(value) if k not in allowed | PLACEHOLDERS]
    assert not unknown, f"{where}: {option} {value!r} names unknown keys {unknown}"


def _invocations() -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(where, command, flags) for every fedvls / python -m fedvls_flwr / bench / scripts call."""
    found = []
    for where, line in LINES:
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            while words and ("=" in words[0] and not words[0].startswith("-") or words[0] in ("env", "time", "nohup")):
                words = words[1:]
            if not words:
                continue
            head = words[0].rsplit("/", 1)[-1]
            if head == "fedvls":
                command, rest = ("fedvls", *words[1:2]), words[2:]
            elif head.startswith("python") and words[1:3] == ["-m", "fedvls_flwr"]:
                command, rest = ("fedvls", *words[3:4]), words[4:]
            elif head.startswith("python") and len(words) > 2 and words[1] == "-m" and words[2].startswith("fedvls_flwr."):
                command, rest = ("fedvls", words[2].split(".")[-1]), words[3:]
            elif head.startswith("python") and len(words) > 1 and re.match(r"(bench|scripts)/\w+\.py$", words[1]):
                command, rest = ("script", words[1]), words[2:]
            else:
                continue
            if command[0] == "fedvls" and len(command) == 2 and command[1] == "deploy" and rest and not rest[0].startswith("-"):
                command, rest = (*command, rest[0]), rest[1:]
            flags = tuple(w.split("=")[0] for w in rest if re.match(r"--[a-z]", w))
            found.append((where, command, flags))
    return found


@cache
def _help(command: tuple[str, ...]) -> str:
    if command[0] == "script":
        res = subprocess.run([sys.executable, str(ROOT / command[1]), "--help"], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
        return res.stdout + res.stderr
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), contextlib.suppress(SystemExit):
        cli.main([*command[1:], "--help"])
    return out.getvalue()


@pytest.mark.parametrize(("where", "command", "flags"), _invocations(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v)
def test_commands_and_flags_in_the_docs_exist(where, command, flags):
    if command[0] == "fedvls" and len(command) > 1 and not command[1].startswith("-"):
        assert command[1] in cli.COMMANDS, f"{where}: `fedvls {command[1]}` is not a command ({', '.join(cli.COMMANDS)})"
    if command[0] == "script":
        assert (ROOT / command[1]).is_file(), f"{where}: {command[1]} does not exist"
    text = _help(command)
    missing = [f for f in flags if f not in text]
    assert not missing, f"{where}: `{' '.join(command)}` does not accept {missing}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _links() -> list[tuple[str, str]]:
    out = []
    for path in DOCS:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        out += [(str(path.relative_to(ROOT)), target) for target in re.findall(r"\]\(([^)\s]+)\)", text)
                if not target.startswith(("http://", "https://", "mailto:"))]
    return out


@pytest.mark.parametrize(("where", "target"), _links(), ids=lambda v: v)
def test_relative_links_and_anchors_resolve(where, target):
    file_part, _, anchor = target.partition("#")
    base = (ROOT / where).parent
    dest = (base / file_part).resolve() if file_part else ROOT / where
    assert dest.exists(), f"{where}: link to {target}: {dest} does not exist"
    if anchor and dest.suffix == ".md":
        anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), flags=re.M)}
        assert anchor in anchors, f"{where}: link to {target}: no heading with anchor #{anchor} in {dest.name}"


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    listed = set(re.findall(r"^\s*\d+\. \[[^]]+\]\(([\w.-]+\.md)\) - \S", index, flags=re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages - listed == set(), f"docs/README.md does not list {sorted(pages - listed)} (one line a page: what it is for)"
    assert listed - pages == set(), f"docs/README.md lists pages that do not exist: {sorted(listed - pages)}"
    assert "](docs/README.md)" in (ROOT / "README.md").read_text(), "README.md does not link docs/README.md"


def test_the_gpu_tables_are_what_the_measured_figures_render():
    """docs/performance.md's GPU tables come from bench/measured/ (a GPU is lent for minutes:
    the figures are kept, the tables rendered from them by bench/gpu_tables.py)."""
    from bench.gpu_tables import END, START, calls, render

    page = (ROOT / "docs" / "performance.md").read_text()
    block = page.split(START, 1)[1].split(END, 1)[0].strip()
    assert block == render(), "run: python bench/gpu_tables.py --write docs/performance.md"
    assert calls(), "bench/measured/ holds no GPU figures"
