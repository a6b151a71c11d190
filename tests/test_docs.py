"""The repository explains itself: docs/ exists, README maps it, the code points at it, and the state
diagram is the engine's transition table.

The design notes, style notes and gateway descriptions the project was started from live outside the
repository; nothing tracked may send a reader there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from durapay.workflows.engine.states import TRANSITIONS, FlowState

ROOT = Path(__file__).resolve().parents[1]
DOCS = (
    "api.md",
    "architecture.md",
    "chaos.md",
    "cli.md",
    "configuration.md",
    "deployment.md",
    "durability.md",
    "events.md",
    "flows.md",
    "gateway.md",
    "observability.md",
    "operations.md",
    "performance.md",
    "security.md",
    "simulator.md",
)
#: Names of documents outside the repository (spelt in pieces so that this file does not match itself).
OUTSIDE_NAMES = ("DESIGN" + ".md", "STYLE" + ".md", "NOTES" + ".md")
OUTSIDE_NAMES += ("gateway-" + "facts", "gateway-" + "interface", "../" + "shared")
OUTSIDE = re.compile("|".join(re.escape(name) for name in OUTSIDE_NAMES))
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".durapay", "build"}


def repository_files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT)
        if any(part in SKIPPED_DIRS or part.endswith(".egg-info") for part in relative.parts):
            continue
        if path.is_file() and path.suffix in {".py", ".md", ".toml", ".yml", ".yaml", ".lua", ".cfg", ".txt", ""}:
            found.append(path)
    return found


def test_nothing_points_outside_the_repository() -> None:
    offenders = []
    for path in repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize("name", DOCS)
def test_docs_exist_and_readme_maps_them(name: str) -> None:
    assert (ROOT / "docs" / name).is_file()
    assert f"](docs/{name})" in (ROOT / "README.md").read_text()


def anchors(path: Path) -> set[str]:
    """The #fragments GitHub makes of a Markdown file's headings: lower case, punctuation but ``-`` and
    ``_`` dropped, spaces made dashes; a repeated heading gets ``-1``, ``-2``... (fenced code skipped)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            counts[slug] = counts.get(slug, -1) + 1
            found.add(slug if counts[slug] == 0 else f"{slug}-{counts[slug]}")
    return found


@pytest.mark.parametrize("name", ["README.md", *(f"docs/{name}" for name in DOCS)])
def test_relative_links_and_their_headings_resolve(name: str) -> None:
    """Every relative link of README.md and docs/ names a file that exists and, with a #fragment into a
    Markdown file, one of its headings (a renamed heading breaks its links silently on GitHub)."""
    path = ROOT / name
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link):
            continue  # http:, mailto: ...
        target, _, fragment = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{link} (no such file)")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{link} (no such heading)")
    assert broken == [], f"{name} links to"


def test_the_state_diagram_is_the_transition_table() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```mermaid\nstateDiagram-v2\n", 1)[1].split("```", 1)[0]
    drawn = {(FlowState(source), FlowState(target)) for source, target in re.findall(r"^\s*(\w+) --> (\w+)", block, re.M)}
    table = {(source, target) for source, targets in TRANSITIONS.items() for target in targets}
    assert drawn == table
    starts = set(re.findall(r"^\s*\[\*\] --> (\w+)", block, re.M))
    assert starts == {FlowState.READY.value, FlowState.SLEEPING.value}


def test_the_cli_reference_names_every_command() -> None:
    """docs/cli.md is the CLI's reference: every command and every group's command is in it."""
    import typer.main
    from typer import _click as click

    from durapay.service.cli import build_app

    text = (ROOT / "docs" / "cli.md").read_text()
    root = typer.main.get_command(build_app())
    context = click.Context(root)
    missing = []
    for name in root.list_commands(context):  # type: ignore[attr-defined]
        command = root.get_command(context, name)  # type: ignore[attr-defined]
        subcommands = getattr(command, "commands", None)
        for sub in subcommands or [None]:
            spelt = f"durapay {name}" + (f" {sub}" if sub else "")
            mentioned = spelt in text or (sub and re.search(rf"durapay {name} [^`]*\b{re.escape(sub)}\b", text))
            if not mentioned:
                missing.append(spelt)
    assert missing == []
