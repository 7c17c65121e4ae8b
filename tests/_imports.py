"""What each module of the package imports, read from its source with ``ast``.

Shared by tests/test_window.py (no import cycle) and tests/test_check.py (the
checker imports nothing of the library).
"""

import ast
import pathlib

import tf1_accum

PACKAGE = pathlib.Path(tf1_accum.__file__).resolve().parent


def modules(package=PACKAGE):
    """Dotted module name -> source path, for every module of ``package``."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(node, name, is_package):
    """The dotted names an import statement imports (with the packages on their way)."""
    if isinstance(node, ast.Import):
        named = [alias.name for alias in node.names]
    else:
        if node.level:  # relative: from its own package, or one above per extra dot
            package = name if is_package else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = ".".join(filter(None, [package, node.module]))
        else:
            base = node.module
        named = [base] + [f"{base}.{alias.name}" for alias in node.names]
    return {".".join(n.split(".")[:i]) for n in named for i in range(1, n.count(".") + 2)}


def package_imports(package=PACKAGE):
    """Each module -> the package's modules it imports anywhere in its source.

    Reads ``import a.b``, ``import a.b as c``, ``from a import b`` (``b`` a
    module or a name in ``a``) and relative imports, wherever they stand:
    inside functions and under ``if TYPE_CHECKING:`` too, since a module that
    needs another only later or only for its types still depends on it. A
    module's own packages are left out: they are imported before it.
    """
    found = modules(package)
    graph = {}
    for name, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imported |= _targets(node, name, path.name == "__init__.py")
        parts = name.split(".")
        own = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        graph[name] = (imported & set(found)) - own
    return graph


def find_cycle(graph):
    """A list of modules that import each other in a ring (first == last), or None."""
    done, path = set(), []

    def visit(module):
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        path.append(module)
        for other in sorted(graph[module]):
            cycle = visit(other)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return None
