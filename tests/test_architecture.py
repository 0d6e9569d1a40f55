"""docs/architecture.md is true to the code: its "who may import whom" table holds for every import in
the tree (parsed with ast, function-level imports included), every package of the tree has a row, and
every path in its "where to change what" table exists. Also: no library package names a `commands`
module, and the doc does not lean on a file outside the repository.

What ast cannot see: `importlib.import_module("x")` with a computed name and `-m module` strings;
tests/test_cli_imports.py checks at run time what `hal` really loads."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def _package_roots() -> dict:
    """Top-level import name -> its folder, for every package of the tree (plugins/ included)."""
    roots = {}
    for folder in [p for p in ROOT.iterdir() if p.is_dir()] + [p for p in (ROOT / "plugins").iterdir() if p.is_dir()]:
        if (folder / "__init__.py").exists() and folder.name not in ("tests",):
            roots[folder.name] = folder
    return roots


def _table(heading_line: str) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after the line containing `heading_line`."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if heading_line in line)
    rows, seen = [], False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            seen = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set("".join(cells)) <= set("-: "):
                rows.append(cells)
        elif seen:
            break
    return rows[1:]  # the header row aside


def allowed_imports() -> dict:
    """package -> the set of our packages it may import, from the doc's table."""
    out = {}
    for first, second in (row[:2] for row in _table("Who may import whom")):
        allowed = set(re.findall(r"`([A-Za-z_]+)`", second))
        for pkg in re.findall(r"`([A-Za-z_]+)`", first):
            out[pkg] = allowed
    return out


def imports_of(folder: Path, ours: set) -> dict:
    """Our top-level package -> [file:line, ...] for every absolute import under `folder`."""
    found: dict = {}
    for path in sorted(folder.rglob("*.py")):
        if "templates" in path.relative_to(folder).parts:  # hal new-plugin's template: a plugin's code
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in ours and top != folder.name:
                    found.setdefault(top, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_every_package_has_a_row():
    table = allowed_imports()
    missing = sorted(set(_package_roots()) - set(table))
    assert not missing, f"docs/architecture.md's import table has no row for {missing}"
    unknown = sorted(set(table) - set(_package_roots()))
    assert not unknown, f"docs/architecture.md's import table names packages that do not exist: {unknown}"


@pytest.mark.parametrize("package", sorted(_package_roots()))
def test_imports_point_down(package):
    roots = _package_roots()
    allowed = allowed_imports().get(package, set())
    found = imports_of(roots[package], set(roots))
    wrong = {pkg: where[:3] for pkg, where in found.items() if pkg not in allowed}
    assert not wrong, (f"{package} imports {sorted(wrong)}, which docs/architecture.md does not allow it "
                       f"(allowed: {sorted(allowed) or 'nothing of ours'}); first places: {wrong}")


def test_the_table_itself_points_down():
    """hal is the bottom; nothing but commands is allowed to import commands."""
    table = allowed_imports()
    assert table["hal"] == set()
    assert [pkg for pkg, allowed in table.items() if "commands" in allowed] == []


def test_where_to_change_what_paths_exist():
    rows = _table("## Where to change what")
    assert len(rows) > 10
    missing = []
    for row in rows:
        for token in re.findall(r"`([^`\s]+)`", row[1]):
            if "/" not in token:
                continue
            pattern = re.sub(r"<[^>]+>", "*", token.rstrip("/"))
            if not list(ROOT.glob(pattern)):
                missing.append(token)
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_self_contained():
    text = DOC.read_text()
    assert "../shared" not in text and "DESIGN.md" not in text
