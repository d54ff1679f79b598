"""Small modules with one job each: no module of the product over MAX_MODULE_LINES, no
function over MAX_FUNCTION_LINES, so that they do not regrow (each time they did, a fix
landed in the largest module because it was there). Generated code is not ours to size.
And a module's name says its job: no two packages hold a module of one name (a search for
`settings.py` found three jobs), but the few in SHARED_NAMES, each with its reason."""

from __future__ import annotations

import ast
from collections import defaultdict

from testing.paths import ROOT

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
SOURCES = ROOT / "src" / "throttledjob"
GENERATED = ("_pb2.py", "_pb2_grpc.py")  # protoc's (node/kubelet)
# A name more than one package uses on purpose -> those packages, and why.
SHARED_NAMES = {
    "__init__.py": (None, "every package has one"),
    "metrics.py": ({"sidecar", "node", "operator"},
                   "each process's own Prometheus series, under the name a reader looks for"),
}


def modules() -> list:
    return [p for p in sorted(SOURCES.rglob("*.py")) if not p.name.endswith(GENERATED)]


def test_no_module_is_over_the_size_limit() -> None:
    over = {str(p.relative_to(ROOT)): n for p in modules()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert over == {}, f"over {MAX_MODULE_LINES} lines: split them by job"


def test_no_function_is_over_the_size_limit() -> None:
    over = {}
    for p in modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    over[f"{p.relative_to(ROOT)}:{node.name}"] = lines
    assert over == {}, f"over {MAX_FUNCTION_LINES} lines"


def packages_by_name() -> dict[str, set[str]]:
    """Each module's file name -> the packages (paths under src/throttledjob/) holding one."""
    out: dict[str, set[str]] = defaultdict(set)
    for p in modules():
        out[p.name].add(str(p.parent.relative_to(SOURCES)))
    return out


def test_no_two_packages_hold_a_module_of_one_name() -> None:
    repeated = {name: sorted(where) for name, where in packages_by_name().items()
                if len(where) > 1}
    unexplained = {name: where for name, where in repeated.items()
                   if name not in SHARED_NAMES
                   or (SHARED_NAMES[name][0] is not None
                       and not set(where) <= SHARED_NAMES[name][0])}
    assert unexplained == {}, "name each module for its job, or say in SHARED_NAMES why not"
    # A name that no longer repeats leaves the list, so the list stays the truth.
    assert sorted(n for n in SHARED_NAMES if n not in repeated) == []
