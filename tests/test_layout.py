"""The layout's rules, checked on the source: dependencies point one way and no module
imports itself round a cycle.

    topologies  <-  controller, hostagent  <-  lab  <-  bench      (tests may use all)

Product packages (what ``pip install`` ships) never import lab or bench code, and no
test module imports another test module (shared helpers live in ``tests/support``).
Every import counts, also one inside a function (the usual way to hide a cycle).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parent.parent
LAYER = {"topologies": 0, "controller": 1, "hostagent": 1, "lab": 2, "bench": 3, "tests": 4}
# Within a layer, who may use whom: the controller and the host agent are independent
# products (they meet only over REST), so neither imports the other.
FORBIDDEN_SAME_LAYER = {("controller", "hostagent"), ("hostagent", "controller")}
PRODUCT = ("topologies", "controller", "hostagent")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def allowed(source: str, target: str) -> bool:
    """May module ``source`` import module ``target``?"""
    ta, tb = source.split(".")[0], target.split(".")[0]
    return LAYER[tb] <= LAYER[ta] and (ta, tb) not in FORBIDDEN_SAME_LAYER


def _imports(text: str, package: str) -> list[set[str]]:
    """The modules of ours that source ``text`` (in ``package``) imports, anywhere in it:
    one set of candidates per imported name (``from pkg import x`` is ``pkg.x`` if that is
    a module, else ``pkg``)."""
    found: list[set[str]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found.extend({alias.name} for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing package
                base = package.split(".")
                base = base[: len(base) - node.level + 1] if node.level > 1 else base
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.extend({f"{mod}.{alias.name}", mod} for alias in node.names)
    return [c for c in found if next(iter(c)).split(".")[0] in LAYER]


def _resolve(candidates: set[str], modules: dict[str, Path]) -> str | None:
    """The most specific existing module among ``candidates`` (or their parents)."""
    for target in sorted(candidates, key=len, reverse=True):
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target:
            return target
    return None


def _extensions() -> dict[str, Path]:
    """Our C extension modules (``pyproject.toml``'s ext-modules): leaves that import nothing."""
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {ext["name"]: REPO / ext["sources"][0] for ext in conf["tool"]["setuptools"].get("ext-modules", [])}


def _graph() -> nx.DiGraph:
    files = [p for top in LAYER for p in (REPO / top).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
    modules.update(_extensions())
    g = nx.DiGraph()
    for name, path in modules.items():
        g.add_node(name)
        if path.suffix != ".py":
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for candidates in _imports(path.read_text(), package):
            target = _resolve(candidates, modules)
            if target and target != name:
                g.add_edge(name, target)
    return g


GRAPH = _graph()


def test_the_graph_sees_the_whole_tree() -> None:
    """Guard against a vacuous pass: the checks below see every package and real edges."""
    tops = {n.split(".")[0] for n in GRAPH}
    assert tops == set(LAYER)
    assert GRAPH.has_edge("lab.transfer", "lab.fabric")
    assert GRAPH.has_edge("controller.core", "controller.trees")
    assert GRAPH.has_edge("hostagent.native", "hostagent._fastrun")  # a C module is a module too


def test_dependencies_point_one_way() -> None:
    wrong = [f"{a} imports {b}" for a, b in GRAPH.edges if not allowed(a, b)]
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles() -> None:
    cycles = [c for c in nx.simple_cycles(GRAPH) if len(c) > 1]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles)


def _is_test_module(name: str) -> bool:
    return name.startswith("tests.") and name.rpartition(".")[2].startswith("test_")


def test_no_test_module_imports_another() -> None:
    bad = [f"{a} imports {b}" for a, b in GRAPH.edges if _is_test_module(a) and _is_test_module(b)]
    assert not bad, "\n".join(bad)


# Tests sit by package and kind: tests/<package>/test_<module>.py for unit tests, and
# tests/lab/ for everything that needs root, Open vSwitch or network namespaces (the
# ``lab`` marker): ``make test-fast`` leaves those out. The top level keeps what
# concerns the whole project.
TEST_DIRS = {"controller", "hostagent", "bench", "lab", "support"}
TOP_LEVEL_TESTS = {"test_layout.py", "test_docs.py", "test_topologies.py", "test_support_teardown.py",
                   "test_deploy.py", "test_grafana.py"}  # (deploy/: manifests and the dashboard)


def test_tests_are_laid_out_by_package_and_kind() -> None:
    tests = REPO / "tests"
    dirs = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert dirs == TEST_DIRS
    assert {p.name for p in tests.glob("test_*.py")} == TOP_LEVEL_TESTS
    for d in TEST_DIRS - {"support"}:
        assert (tests / d / "__init__.py").exists(), d  # (unique module names: tests.<d>.test_x)
        assert list((tests / d).glob("test_*.py")), d


def test_lab_tests_live_in_tests_lab() -> None:
    """A file outside tests/lab/ whose every test needs the lab (a module-wide ``lab``
    marker) belongs in tests/lab/."""
    wrong = []
    for path in (REPO / "tests").rglob("test_*.py"):
        if path.parent.name == "lab":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets) \
                    and "lab" in ast.unparse(node.value):
                wrong.append(str(path.relative_to(REPO)))
    assert not wrong, wrong


def test_pip_ships_only_the_product() -> None:
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = conf["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted({p.rstrip("*") for p in include}) == sorted(PRODUCT)


@pytest.mark.parametrize("source, target, ok", [
    ("lab.fabric", "controller.core", True), ("bench.scale", "lab.netsim", True),
    ("tests.lab.test_e2e", "bench.baselines", True), ("hostagent.cli", "lab.sh", False),
    ("topologies.spec", "controller.core", False), ("controller.app", "hostagent.wire", False),
    ("lab.ovs", "bench.net", False),
])
def test_the_rule(source: str, target: str, ok: bool) -> None:
    assert allowed(source, target) is ok


def test_imports_hidden_in_functions_and_relative_ones_are_seen() -> None:
    text = (
        "import os\n"
        "from . import wire\n"
        "from ..lab import sh\n"
        "def f():\n"
        "    from bench.net import main\n"
        "    import topologies.spec\n"
    )
    modules = dict.fromkeys(["hostagent", "hostagent.sub", "hostagent.sub.wire", "bench.net",
                             "topologies.spec", "topologies"], Path())
    got = {_resolve(c, modules) for c in _imports(text, "hostagent.sub")}
    # `from . import wire` is the module wire, not the package; `from ..lab import sh`
    # resolves inside hostagent (no such module: its nearest existing parent)
    assert got == {"hostagent.sub.wire", "hostagent", "bench.net", "topologies.spec"}


# One controller, in Python, made of rooms a newcomer can read: each manager owns one
# thing, the Ryu app stays a shim, and there is no second implementation in C.
MAX_CONTROLLER_MODULE, MAX_CLASS, MAX_APP = 900, 600, 450


def _controller_files() -> list[Path]:
    return sorted((REPO / "controller").rglob("*.py"))


def test_the_controller_is_python_only() -> None:
    other = [p.name for p in (REPO / "controller").rglob("*") if p.is_file() and p.suffix in (".c", ".h", ".pyx")]
    assert not other, f"C under controller/: {other}"
    assert "controller" not in {name.split(".")[0] for name in _extensions()}


def test_controller_modules_and_classes_stay_small() -> None:
    too_long = []
    for path in _controller_files():
        text = path.read_text()
        lines = len(text.splitlines())
        limit = MAX_APP if path.name == "app.py" else MAX_CONTROLLER_MODULE
        if lines > limit:
            too_long.append(f"{path.name}: {lines} lines > {limit}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS:
                too_long.append(f"{path.name}: class {node.name} {node.end_lineno - node.lineno + 1} lines > {MAX_CLASS}")
    assert not too_long, "\n".join(too_long)


def test_the_size_check_sees_a_long_class() -> None:
    """Guard against a vacuous pass: the walk above finds classes and measures them."""
    core = ast.parse((REPO / "controller" / "core.py").read_text())
    sizes = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(core) if isinstance(n, ast.ClassDef)}
    assert sizes.get("MulticastCore", 0) > 200
