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

from throttledjob import __version__

_RUNTIME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONTRACTS = os.path.join(os.path.dirname(_RUNTIME), "contracts")
# The copy comes first on PYTHONPATH, so it shadowed an installed throttledjob in every
# Python the workload started (`throttledjob run --inject -- throttledjob run ...`: no
# module named throttledjob.cli): its path extends to the other throttledjob folders on
# sys.path, whose modules stay importable (this copy's runtime and contracts come first).
_PACKAGE_INIT = '''"""ThrottledJob runtime library (injected copy)."""

import os as _os
import sys as _sys

__version__ = {version!r}

# pkgutil.extend_path, less its imports (typing, re: ~10 ms in every interpreter).
for _entry in _sys.path:
    _folder = _os.path.join(_entry, __name__) if isinstance(_entry, str) and _entry else ""
    if _folder and _folder not in __path__ and _os.path.isdir(_folder):
        __path__.append(_folder)
del _os, _sys, _entry, _folder
'''


def write_library(dest: str) -> str:
    """Copy the runtime library and the start-up hook into `dest`; returns `dest`."""
    package = os.path.join(dest, "throttledjob")
    os.makedirs(package, exist_ok=True)
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write(_PACKAGE_INIT.format(version=__version__))
    for source in (_RUNTIME, _CONTRACTS):
        shutil.copytree(source, os.path.join(package, os.path.basename(source)),
                        dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(os.path.join(_RUNTIME, "inject", "sitecustomize.py"),
                 os.path.join(dest, "sitecustomize.py"))
    return dest


def pythonpath_with(dest: str, existing: str | None) -> str:
    """PYTHONPATH with `dest` first, keeping what the user had set."""
    return dest if not existing else f"{dest}{os.pathsep}{existing}"
