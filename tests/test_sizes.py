"""Small modules with one job each: no module of the product over MAX_MODULE_LINES, no
function over MAX_FUNCTION_LINES, so that they do not regrow (each time they did, a fix
landed in the largest module because it was there). Generated code is not ours to size."""

from __future__ import annotations

import ast

from testing.paths import ROOT

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
SOURCES = ROOT / "src" / "throttledjob"
GENERATED = ("_pb2.py", "_pb2_grpc.py")  # protoc's (node/kubelet)


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
