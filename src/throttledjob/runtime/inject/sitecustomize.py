"""Loaded by Python at start-up when this folder is on PYTHONPATH (ThrottledJob inject).

Installs the torch auto-hook, then runs the sitecustomize this one shadows, if any, so
that an image's own start-up customisation keeps working.
"""


def _throttledjob_start() -> None:
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from throttledjob.runtime import autohook

        autohook.install()
    except Exception as e:  # never break the interpreter start
        sys.stderr.write(f"throttledjob: auto-hook not loaded: {e!r}\n")
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        other = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(other):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", other)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            break


_throttledjob_start()
del _throttledjob_start
