"""docs/architecture.md is true to the code, module by module.

- Its "who may import whom" table holds for every import of every library module (parsed with ast,
  function-level imports included): a row names a layer (`hal.core`) or one module (`hal.sdk`), and
  lists the layers or modules it may import; every layer of the tree has a row.
- Plugins import only `hal.sdk` of hal (hal_kunlun may import hal_cuda, whose class it subclasses).
- No import cycle between library modules (function-level imports count: hiding an import inside a
  function does not break a cycle).
- Every path in its "where to change what" table exists.

What ast cannot see: `importlib.import_module("x")` with a computed name and `-m module` strings;
tests/test_cli_imports.py checks at run time what `hal` really loads.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PLUGINS = ("hal_cpu", "hal_cuda", "hal_ascend", "hal_kunlun")


def _table(heading_line: str, text: str | None = None) -> list[list[str]]:
    """The rows (cells) of the first Markdown table after the line containing `heading_line`."""
    lines = (text if text is not None else DOC.read_text()).splitlines()
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


def allowed_imports(text: str | None = None) -> dict[str, set[str]]:
    """Layer or module -> the layers and modules of ours it may import, from the doc's table."""
    out = {}
    for first, second in (row[:2] for row in _table("Who may import whom", text)):
        allowed = set(re.findall(r"`([A-Za-z_][\w.]*)`", second))
        for unit in re.findall(r"`([A-Za-z_][\w.]*)`", first):
            out[unit] = allowed
    return out


def library_modules() -> dict[str, Path]:
    """Dotted module name -> file, for hal and the plugins (templates are a plugin's code, not ours)."""
    out = {}
    for base, tops in ((ROOT, ["hal"]), (ROOT / "plugins", list(PLUGINS))):
        for top in tops:
            for path in sorted((base / top).rglob("*.py")):
                if "templates" in path.relative_to(base / top).parts:
                    continue
                name = ".".join(path.relative_to(base).with_suffix("").parts)
                out[name.removesuffix(".__init__")] = path
    return out


MODULES = library_modules()


def _targets(node: ast.AST, package: str) -> list[str]:
    """The dotted names one import statement reaches: `from a import b` reaches the module a.b where
    there is one, else a (b is a name defined in a)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        module = f"{base}.{node.module}" if node.module else base
    else:
        module = node.module or ""
    return [f"{module}.{a.name}" if f"{module}.{a.name}" in MODULES else module for a in node.names]


def import_edges(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """Module -> {imported module of ours: first line}, every import statement included."""
    edges: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = edges.setdefault(name, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    found.setdefault(target, node.lineno)
    return edges


def unit_of(module: str, units: set[str]) -> str:
    """The table row a module falls under: the longest row name that is it or a package above it."""
    best = ""
    for unit in units:
        if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
            best = unit
    return best


def violations(edges: dict[str, dict[str, int]], table: dict[str, set[str]],
               modules: dict[str, Path]) -> list[str]:
    """Every import the table does not allow, as 'file:line: a imports b (row R allows ...)'."""
    units = set(table)
    wrong = []
    for src, targets in sorted(edges.items()):
        row = unit_of(src, units)
        for dst, line in sorted(targets.items()):
            if row and unit_of(dst, units) == row:
                continue  # inside one layer
            if any(dst == a or dst.startswith(a + ".") for a in table.get(row, ())):
                continue
            where = modules[src].relative_to(ROOT)
            wrong.append(f"{where}:{line}: {src} imports {dst} (row `{row or '?'}` allows "
                         f"{sorted(table.get(row, ())) or 'nothing of ours'})")
    return wrong


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, {})))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out




EDGES = import_edges(MODULES)


def test_every_layer_has_a_row():
    table = allowed_imports()
    rowless = sorted({m for m in MODULES if not unit_of(m, set(table))})
    assert not rowless, f"docs/architecture.md's import table has no row for {rowless}"
    unknown = sorted(u for u in table if not any(m == u or m.startswith(u + ".") for m in MODULES))
    assert not unknown, f"docs/architecture.md's import table names modules that do not exist: {unknown}"


def test_imports_follow_the_table():
    wrong = violations(EDGES, allowed_imports(), MODULES)
    assert not wrong, "imports docs/architecture.md does not allow:\n" + "\n".join(wrong[:30])


def test_plugins_import_only_the_sdk():
    wrong = []
    for src, targets in EDGES.items():
        if not src.startswith(PLUGINS):
            continue
        for dst, line in targets.items():
            if dst.startswith("hal") and not dst.startswith("hal_") and dst != "hal.sdk":
                wrong.append(f"{MODULES[src].relative_to(ROOT)}:{line}: {dst}")
            if dst.startswith("hal_") and dst.split(".")[0] != src.split(".")[0] \
                    and not (src.startswith("hal_kunlun") and dst.startswith("hal_cuda")):
                wrong.append(f"{MODULES[src].relative_to(ROOT)}:{line}: {dst} (another plugin)")
    assert not wrong, "plugins may import only hal.sdk of hal:\n" + "\n".join(wrong)


def test_hal_imports_no_plugin():
    wrong = [f"{src} imports {dst}" for src, t in EDGES.items() if src.startswith("hal.") or src == "hal"
             for dst in t if dst.startswith("hal_")]
    assert not wrong, wrong


def test_no_import_cycles():
    found = cycles(EDGES)
    assert not found, "import cycles (function-level imports included):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_checks_fail_on_a_deliberate_violation():
    """A contract module importing the trainer, a plugin importing hal.core, and a cycle are each caught."""
    table = allowed_imports()
    bad = {k: dict(v) for k, v in EDGES.items()}
    bad["hal.contract.chips"]["hal.trainer.loop"] = 1
    assert any("hal.contract.chips imports hal.trainer.loop" in w for w in violations(bad, table, MODULES))
    bad["hal.trainer.loop"]["hal.contract.chips"] = 1
    assert any({"hal.contract.chips", "hal.trainer.loop"} <= set(c) for c in cycles(bad))


def test_the_table_points_down():
    """The contract is the bottom; nothing but the CLI imports the CLI; plugins see only the SDK."""
    table = allowed_imports()
    assert table["hal.contract"] == set()
    assert [u for u, allowed in table.items() if "hal.cli" in allowed] == []
    for plugin in ("hal_cpu", "hal_cuda", "hal_ascend"):
        assert table[plugin] == {"hal.sdk"}


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
