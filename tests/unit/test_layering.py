"""The layers hold (ARCHITECTURE.md, Layers): what sits above the storage core uses only
its public API, and no module takes another module's private names.

The sources are parsed with `ast`, not imported and not grepped:
  - imports: `from X import Y`, `import X.Y` and `from PKG import SUBMODULE` (then the
    attributes read from that module's name) are resolved to the module they reach;
  - reaching into a Log: a call `something.partition(stream, number)` (Log's way to a
    Partition; str.partition takes one argument), an attribute read through a
    `.partition` object (a Reader's Partition: `reader.partition.next_offset`),
    `.ring` and `.appender` (a Partition's tail ring and writer), and a Log's private
    members (read from log.py's class Log) on anything but `self`. A Partition's
    `.index` is caught with the Partition it is read from (a bare `.index` is a
    list's method, or a field of a Kafka request).
Privacy is judged for our own modules only (kafka/codec.py's use of kio's private
modules is kio's business).

The public modules, and why each is, are listed once: streamlog.api.PUBLIC_MODULES.
What cannot be fixed yet is in ALLOWED below, each with its reason; an entry that no
longer matches anything fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pathlib

import pytest

from streamlog.api import PUBLIC_MODULES

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The packages above the storage core (ARCHITECTURE.md, Layers).
OUTER = ("streamlog.wire", "streamlog.kafka", "streamlog.operators", "streamlog.cli",
         "streamlog.console",
         "spark_source", "spark_sink")
# The library: every module shipped (tests, bench and dev scripts are not).
LIBRARY = ("streamlog", "spark_source", "spark_sink", "pyspark_streamlog")
# A Partition's members that nothing above the core reads.
PARTITION_MEMBERS = ("ring", "appender")

# (module, what) -> why it is still there. `what` is a Violation's text.
_SPARK_SHARED = ("spark_sink shares spark_source's option parsing (the Kafka source's "
                 "option names) and its shipping to executors: the two packages are one "
                 "integration; a public module of spark_source for what they share "
                 "would end it")
ALLOWED: dict[tuple[str, str], str] = {
    ("spark_sink._options", "imports private module spark_source._options"): _SPARK_SHARED,
    ("spark_sink._writer", "imports private module spark_source._options"): _SPARK_SHARED,
    ("spark_sink._writer", "imports private module spark_source._ship"): _SPARK_SHARED,
}


@dataclasses.dataclass(frozen=True)
class Violation:
    module: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.what}"


# -- modules and names -----------------------------------------------------------------

def module_path(name: str, root: pathlib.Path = ROOT) -> pathlib.Path | None:
    """The file of module `name` under `root`, or None when it is not one of ours."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_modules(root: pathlib.Path = ROOT) -> list[tuple[str, pathlib.Path]]:
    out = []
    for top in LIBRARY:
        single = root / f"{top}.py"
        paths = [single] if single.is_file() else sorted((root / top).rglob("*.py"))
        out += [(module_name(path, root), path) for path in paths]
    assert out
    return out


def in_package(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def is_core(module: str) -> bool:
    """The storage core: streamlog and its modules, except the packages above it."""
    return in_package(module, ("streamlog",)) and not in_package(module, OUTER)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def package_of(module: str, path: pathlib.Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def resolve(node: ast.ImportFrom, module: str, path: pathlib.Path) -> str:
    """The absolute module a `from ... import` reads from."""
    if node.level == 0:
        return node.module
    package = package_of(module, path).split(".")
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


# -- the checks ------------------------------------------------------------------------

class Checker:
    """Walks one module's tree; `violations` is what it found."""

    def __init__(self, module: str, path: pathlib.Path, tree: ast.AST, *,
                 root: pathlib.Path = ROOT, log_private: frozenset[str] = frozenset()):
        self.module, self.path, self.tree, self.root = module, path, tree, root
        self.outer = in_package(module, OUTER)
        self.log_private = log_private
        self.package = package_of(module, path)
        self.bound: dict[str, str] = {}  # a local name -> the core module it names
        self.violations: list[Violation] = []

    def run(self) -> list[Violation]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom):
                self._import_from(node)
            elif isinstance(node, ast.Import):
                self._import(node)
        inner = {id(node.value) for node in ast.walk(self.tree)
                 if isinstance(node, ast.Attribute)}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute):
                self._attribute(node, whole_chain=id(node) not in inner)
            elif isinstance(node, ast.Call) and self.outer:
                self._call(node)
        return self.violations

    def _add(self, node: ast.AST, what: str) -> None:
        self.violations.append(Violation(self.module, node.lineno, what))

    # imports --------------------------------------------------------------------------

    def _import_from(self, node: ast.ImportFrom) -> None:
        source = resolve(node, self.module, self.path)
        if self._private_module(node, source):
            return
        for alias in node.names:
            submodule = f"{source}.{alias.name}"
            if alias.name != "*" and module_path(submodule, self.root) is not None:
                self._module_reached(node, submodule)  # `from PKG import MODULE`
                self.bound[alias.asname or alias.name] = submodule
                continue
            if is_private(alias.name) and self._ours(source):
                self._add(node, f"imports private name {alias.name} from {source}")
            elif self.outer and is_core(source):
                self._name_reached(node, source, alias.name)

    def _import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._module_reached(node, alias.name)
            top = alias.name.partition(".")[0]
            if module_path(top, self.root) is None:
                continue  # not one of ours
            if alias.asname:
                self.bound[alias.asname] = alias.name
            else:
                self.bound[top] = top

    def _ours(self, module: str) -> bool:
        return module_path(module.partition(".")[0], self.root) is not None

    def _private_module(self, node: ast.AST, target: str) -> bool:
        """Is `target` (or a package on its path) one of our modules private to
        another package? A package's own modules use its private modules
        (spark_sink._commit)."""
        if not self._ours(target):
            return False  # another project's privacy is its own business
        parts = target.split(".")
        for depth in range(1, len(parts)):
            parent, part = ".".join(parts[:depth]), parts[depth]
            if is_private(part) and not in_package(self.package, (parent,)):
                self._add(node, f"imports private module {target}")
                return True
        return False

    def _module_reached(self, node: ast.AST, target: str) -> bool:
        """`target` imported as a module object; False when that is a violation."""
        if self._private_module(node, target):
            return False
        if self.outer and is_core(target) and target not in PUBLIC_MODULES:
            self._add(node, f"imports {target}, not a public module of the core")
            return False
        return True

    def _name_reached(self, node: ast.AST, module: str, name: str) -> None:
        public = PUBLIC_MODULES.get(module)
        if public is None:
            self._add(node, f"imports {name} from {module}, not a public module of the core")
        elif public[0] is not None and name not in public[0]:
            self._add(node, f"imports {name} from {module}, not one of its public names")

    # attributes -------------------------------------------------------------------------

    def _attribute(self, node: ast.Attribute, *, whole_chain: bool) -> None:
        chain = _dotted(node)
        if chain is not None and chain[0] in self.bound:
            if whole_chain:  # (`a.b.c` is judged once, not again as `a.b`)
                self._module_attribute(node, self.bound[chain[0]], chain[1:])
            return
        if not self.outer:
            return
        if isinstance(node.value, ast.Attribute) and node.value.attr == "partition":
            self._add(node, f"reads .{node.attr} of a .partition object (a Partition)")
        elif node.attr in PARTITION_MEMBERS:
            self._add(node, f"reads .{node.attr} (a Partition's)")
        elif node.attr in self.log_private and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            self._add(node, f"reads .{node.attr} (a Log's private member)")

    def _module_attribute(self, node: ast.Attribute, module: str, names) -> None:
        """`module.a.b...` read from a name bound to a module: the submodules along
        the chain, then the first name that is not a module, are judged."""
        for name in names:
            target = f"{module}.{name}"
            if module_path(target, self.root) is None:
                break
            if not self._module_reached(node, target):
                return
            module = target
        else:
            return  # the chain names a module
        if is_private(name) and module != self.module:
            self._add(node, f"reads private name {name} of {module}")
        elif self.outer and is_core(module):
            self._name_reached(node, module, name)

    def _call(self, node: ast.Call) -> None:
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "partition"
                and len(node.args) + len(node.keywords) >= 2):
            self._add(node, "calls .partition(stream, number) (a Log's Partition)")


def _dotted(node: ast.Attribute) -> list[str] | None:
    """['a', 'b', 'c'] for `a.b.c`, None when the chain does not start at a name."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(names)]


# Class Log is written in these modules: log.py, and the classes it inherits from.
LOG_MODULES = ("log", "log_txn", "log_admin", "log_follow")


def log_private_members(root: pathlib.Path = ROOT) -> frozenset[str]:
    """Class Log's private methods and attributes, read from log.py and the modules of
    the classes it inherits from."""
    tree = ast.parse((root / "streamlog" / "log.py").read_text())
    (log_class,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Log"]
    bases = {base.id for base in log_class.bases if isinstance(base, ast.Name)}
    classes = [log_class]
    for name in LOG_MODULES[1:]:
        module = ast.parse((root / "streamlog" / f"{name}.py").read_text())
        classes += [n for n in module.body if isinstance(n, ast.ClassDef) and n.name in bases]
    assert len(classes) == 1 + len(bases), "a base class of Log is not in LOG_MODULES"
    names = set()
    for node in (inner for klass in classes for inner in ast.walk(klass)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (
                node.value.id == "self") and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    private = frozenset(name for name in names if is_private(name))
    assert {"_partitions", "_reopened"} <= private  # (the parse found the classes)
    return private


def violations(root: pathlib.Path = ROOT) -> list[Violation]:
    private = log_private_members(root)
    found = []
    for module, path in library_modules(root):
        tree = ast.parse(path.read_text(), filename=str(path))
        found += Checker(module, path, tree, root=root, log_private=private).run()
    return found


def runtime_imports(module: str, path: pathlib.Path, tree: ast.AST,
                    root: pathlib.Path = ROOT) -> set[str]:
    """The library modules `module` imports when it runs (in functions too; not under
    `if TYPE_CHECKING:`, which only a type checker reads)."""
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                   for child in node.body for inner in ast.walk(child)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            source = resolve(node, module, path)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if module_path(submodule, root) is not None:
                    found.add(submodule)
                elif module_path(source, root) is not None:
                    found.add(source)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names
                         if module_path(alias.name, root) is not None)
    found.discard(module)
    return found


def import_cycles(root: pathlib.Path = ROOT) -> list[list[str]]:
    """The library's import cycles: each strongly connected set of modules (Tarjan's
    algorithm, iterative), sorted."""
    graph = {module: runtime_imports(module, path, ast.parse(path.read_text()), root)
             for module, path in library_modules(root)}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in graph:
        if start in order:
            continue
        work = [(start, iter(sorted(graph[start])))]
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in graph:
                    continue
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], order[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return sorted(cycles)


# -- the tests -----------------------------------------------------------------------

# No module of the library is longer than this; the partition's owner far less.
MODULE_LINES_MAX = 600
PARTITION_LINES_MAX = 400


def test_no_module_of_the_library_is_too_long():
    lengths = {module: len(path.read_text().splitlines())
               for module, path in library_modules()}
    too_long = {module: n for module, n in lengths.items() if n > MODULE_LINES_MAX}
    assert not too_long, f"over {MODULE_LINES_MAX} lines: {too_long}"
    assert lengths["streamlog.partition"] < PARTITION_LINES_MAX


def test_the_librarys_imports_have_no_cycle():
    assert import_cycles() == []


def test_the_cycle_finder_finds_cycles(tmp_path):
    package = tmp_path / "streamlog"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .c import x\n")
    (package / "c.py").write_text("from .a import y\n")
    (package / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from .a import y\n")
    (package / "e.py").write_text("from .d import z\n")
    for top in ("spark_source", "spark_sink"):
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("")
    assert import_cycles(tmp_path) == [["streamlog.a", "streamlog.b", "streamlog.c"]]


def test_the_layers_hold_except_for_the_listed_exceptions():
    found = violations()
    unexpected = [str(v) for v in found if (v.module, v.what) not in ALLOWED]
    assert not unexpected, "\n".join(["outside the public API:", *unexpected])
    stale = set(ALLOWED) - {(v.module, v.what) for v in found}
    assert not stale, f"allowed but no longer found (remove them): {sorted(stale)}"


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_each_public_module_exists_says_why_and_has_its_names(module):
    names, reason = PUBLIC_MODULES[module]
    assert len(reason) > 20, module
    imported = importlib.import_module(module)
    for name in names or ():
        assert hasattr(imported, name), f"{module} has no {name}"
        assert not is_private(name), name


def _check_source(tmp_path, module: str, source: str) -> list[str]:
    """Violations of one module written at `module` under a copy of the layout."""
    path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    others = ("streamlog/reader.py", "streamlog/partition.py", "streamlog/payload.py",
              "spark_sink/_commit.py")
    for file in [path, *(tmp_path / other for other in others)]:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.touch()
        for parent in file.parents:
            if parent == tmp_path:
                break
            (parent / "__init__.py").touch()
    path.write_text(source)
    tree = ast.parse(source)
    checker = Checker(module, path, tree, root=tmp_path, log_private=frozenset({"_partitions"}))
    return [v.what for v in checker.run()]


@pytest.mark.parametrize("module, source, expected", [
    ("streamlog.kafka.broker", "from ..reader import _WAIT\n",
     ["imports private name _WAIT from streamlog.reader"]),
    ("streamlog.kafka.broker", "from ..reader import WAIT\n", []),
    ("streamlog.wire.session", "from ..partition import Partition\n",
     ["imports Partition from streamlog.partition, not a public module of the core"]),
    ("streamlog.wire.session", "from .. import partition\n",
     ["imports streamlog.partition, not a public module of the core"]),
    ("streamlog.cli.read", "import streamlog.partition\n",
     ["imports streamlog.partition, not a public module of the core"]),
    ("spark_source.plan", "import streamlog\nstreamlog.partition.Partition\n",
     ["imports streamlog.partition, not a public module of the core"]),
    ("spark_source.plan", "import streamlog\nstreamlog.reader.Reader(streamlog.open_log)\n",
     []),
    ("spark_source.plan", "import streamlog.reader\nstreamlog.reader.Partition\n",
     ["imports Partition from streamlog.reader, not one of its public names"]),
    ("streamlog.wire.session", "from ..payload import Columns, _offsets\n",
     ["imports private name _offsets from streamlog.payload"]),
    ("streamlog.wire.session", "from .. import payload\npayload._offsets\n",
     ["reads private name _offsets of streamlog.payload"]),
    ("streamlog.wire.client", "from ..reader import Reader\nfrom ..txn import encode_begin\n",
     ["imports encode_begin from streamlog.txn, not one of its public names"]),
    ("streamlog.kafka.broker", "log.partition('t', 0).ring\n",
     ["reads .ring (a Partition's)", "calls .partition(stream, number) (a Log's Partition)"]),
    ("streamlog.wire.session", "reader.partition.next_offset\n",
     ["reads .next_offset of a .partition object (a Partition)"]),
    ("streamlog.wire.session", "log._partitions('t')\nself._partitions('t')\n",
     ["reads ._partitions (a Log's private member)"]),
    ("spark_sink._remote", "item.partition('@')\nrecord.partition\n", []),
    ("spark_sink._remote", "from ._commit import chunks\n", []),
    ("spark_sink._writer", "from . import _commit\n", []),
    ("spark_source.plan", "from spark_sink._commit import chunks\n",
     ["imports private module spark_sink._commit"]),
    ("streamlog.log", "from .partition import Partition\nmy.partition('t', 0).ring\n", []),
])
def test_the_checker_on_small_sources(tmp_path, module, source, expected):
    assert sorted(_check_source(tmp_path, module, source)) == sorted(expected)
