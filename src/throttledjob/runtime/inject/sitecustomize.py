"""Loaded by Python at start-up when this folder is on PYTHONPATH (ThrottledJob inject).

Installs the torch auto-hook, then runs the sitecustomize this one shadows, if any, so
that an image's own start-up customisation keeps working.
"""

# Every Python the workload starts reads this file, Python 2 included: no syntax newer
# than 2.7 here (no annotations, no f-strings), and nothing at all below 3.7.
# The words "(ThrottledJob inject)" above mark every copy of this file, old ones too.


def _throttledjob_start():
    import sys

    # Once per interpreter: with two copies on sys.path (a nested `throttledjob run
    # --inject`, or one folder reached through a symlink) each ran the other, forever.
    if sys.version_info < (3, 7) or getattr(sys, "_throttledjob_started", False):
        return
    sys._throttledjob_started = True
    sys._throttledjob_starting = True  # the runtime loads nothing it can load later
    try:
        from throttledjob.runtime import autohook

        autohook.install()
    except Exception as e:  # never break the interpreter start
        sys.stderr.write("throttledjob: auto-hook not loaded: " + repr(e) + "\n")
    del sys._throttledjob_starting
    _run_shadowed_sitecustomize(sys)


def _run_shadowed_sitecustomize(sys):
    """Run the first sitecustomize on sys.path that is not a copy of this one, as Python
    would have: any form (module, package, .pyc alone), as sys.modules["sitecustomize"]."""
    from importlib.machinery import PathFinder

    for entry in sys.path:
        spec = PathFinder.find_spec("sitecustomize", [entry])
        # origin None: a folder without __init__.py, which Python passes over as well
        if (spec is None or spec.loader is None or spec.origin is None
                or _is_throttledjob_copy(spec.origin)):
            continue
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
        # The import of this file ends by returning what sys.modules holds under its name:
        # `import sitecustomize` then gives the image's module, as without us.
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
        return


def _is_throttledjob_copy(origin):
    try:
        with open(origin, "rb") as f:
            return b"(ThrottledJob inject)" in f.read(512)
    except OSError:
        return False


_throttledjob_start()
