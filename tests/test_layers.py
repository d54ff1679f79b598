"""The layers stay layered: the GPU device layer (throttledjob.gpu) and the shared bounded
HTTP server (throttledjob.serving) sit under both the pod's sidecar and the node agent, and
the node agent does not reach into the sidecar (docs/dev/architecture.md); inside the
sidecar, the CPU half (sidecar/cpu/) and the GPU half (sidecar/gpu_*.py) import nothing of
each other, only the loop both share joins them; the guard, whose script is
cli.guard_main, imports nothing of the CLI (no import circle). Read from the source with
`ast`: every import, absolute or relative, at any depth of a function."""

from __future__ import annotations

import pytest

from testing.imports import PACKAGE, imported, module_name, within
from testing.paths import ROOT

SIDECAR, NODE, CLI = "throttledjob.sidecar", "throttledjob.node", "throttledjob.cli"
CPU_HALF = f"{SIDECAR}.cpu"
GPU_HALF = tuple(sorted(f"{SIDECAR}.{p.stem}" for p in (PACKAGE / "sidecar").glob("gpu_*.py")))
# Where -> the packages it must not import.
RULES = {
    "node": (SIDECAR,),
    "gpu": (SIDECAR, NODE),
    "serving.py": (SIDECAR, NODE),
    "sidecar/cpu/guard.py": (CLI,),
    "sidecar/cpu": GPU_HALF,
    **{f"sidecar/{m.rpartition('.')[2]}.py": (CPU_HALF,) for m in GPU_HALF},
}


def violations(where: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    root = PACKAGE / where
    paths = sorted(root.rglob("*.py")) if root.is_dir() else [root]
    bad = {}
    for path in paths:
        names = imported(path.read_text(), module_name(path), path.name == "__init__.py")
        if hits := sorted(n for n in names if any(within(n, f) for f in forbidden)):
            bad[str(path.relative_to(ROOT))] = hits
    return bad


@pytest.mark.parametrize("where", sorted(RULES))
def test_a_lower_layer_imports_no_higher_one(where: str) -> None:
    assert (PACKAGE / where).exists(), where
    assert violations(where, RULES[where]) == {}


@pytest.mark.parametrize("line", [
    "import throttledjob.sidecar.gpu_agent",
    "import throttledjob.sidecar as s",
    "from throttledjob.sidecar.server import MetricsServer",
    "from throttledjob import sidecar",
    "from ..sidecar import exporter",
    "from ..sidecar.exporter import log_to_stderr",
    "from .. import sidecar",
    "def f():\n    from ..sidecar import pod",
    "importlib.import_module('throttledjob.sidecar.pod')",
])
def test_the_check_sees_every_form_of_import(line: str) -> None:
    names = imported(line, "throttledjob.node.caps", is_package=False)
    assert any(within(n, SIDECAR) for n in names), names


def test_the_check_resolves_relative_imports_from_the_right_package() -> None:
    assert imported("from .caps import CapKeeper", "throttledjob.node", is_package=True) \
        == {"throttledjob.node.caps", "throttledjob.node.caps.CapKeeper"}
    assert imported("from .backend import GpuError", "throttledjob.gpu.nvml", False) \
        == {"throttledjob.gpu.backend", "throttledjob.gpu.backend.GpuError"}
    assert not any(within(n, SIDECAR) for n in
                   imported("from .socket_protocol import serve", "throttledjob.node.process",
                            False))


def test_the_gpu_half_is_found() -> None:
    assert f"{SIDECAR}.gpu_agent" in GPU_HALF and len(GPU_HALF) >= 2, GPU_HALF
