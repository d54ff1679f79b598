"""The product's imports, read from its source with `ast` (no import runs): what the
layering check (tests/test_layers.py) and the architecture map's check
(tests/test_architecture_map.py) read."""

from __future__ import annotations

import ast
from pathlib import Path

from testing.paths import ROOT

SOURCES = ROOT / "src"
PACKAGE = SOURCES / "throttledjob"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCES).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, is_package: bool) -> set[str]:
    """Every module `source` (the text of `module`) imports, as absolute names: for
    `from X import a`, X and X.a (a may be a module: `from throttledjob import sidecar`).
    A call to importlib.import_module or __import__ with a literal name counts too."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__")):
            found.add(node.args[0].value)
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def imports_of(path: Path) -> set[str]:
    """The modules the product's file `path` imports, as absolute names."""
    return imported(path.read_text(), module_name(path), path.name == "__init__.py")
