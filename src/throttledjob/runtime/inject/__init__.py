"""Make the runtime library loadable by any Python: a self-contained copy plus a hook.

`write_library(dest)` lays out `dest/throttledjob/runtime/...`, the contracts it reads and
writes (`dest/throttledjob/contracts/...`) and `dest/sitecustomize.py`;
with `dest` on PYTHONPATH, any Python 3 program gets the auto-hook, even one whose
environment has no throttledjob installed. The operator's init container and
`throttledjob run --inject` both use it.
"""

from __future__ import annotations

import os
import shutil

_RUNTIME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONTRACTS = os.path.join(os.path.dirname(_RUNTIME), "contracts")
_PACKAGE_INIT = '"""ThrottledJob runtime library (injected copy)."""\n'


def write_library(dest: str) -> str:
    """Copy the runtime library and the start-up hook into `dest`; returns `dest`."""
    package = os.path.join(dest, "throttledjob")
    os.makedirs(package, exist_ok=True)
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write(_PACKAGE_INIT)
    for source in (_RUNTIME, _CONTRACTS):
        shutil.copytree(source, os.path.join(package, os.path.basename(source)),
                        dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(os.path.join(_RUNTIME, "inject", "sitecustomize.py"),
                 os.path.join(dest, "sitecustomize.py"))
    return dest


def pythonpath_with(dest: str, existing: str | None) -> str:
    """PYTHONPATH with `dest` first, keeping what the user had set."""
    return dest if not existing else f"{dest}{os.pathsep}{existing}"
