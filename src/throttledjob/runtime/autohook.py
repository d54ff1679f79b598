"""Zero-code pacing for PyTorch programs: loaded at interpreter start by sitecustomize.

`install()` only adds an import watcher: nothing else is imported, so a program that
never imports torch pays one cheap check per first import of a module. When torch is
imported, the hook
  - applies the thread cap and GPU memory fraction from the settings,
  - paces at every `Optimizer.step()` (a global optimizer post-hook), and, for loops
    without an optimizer (inference), at every DataLoader batch (never both),
  - overrides DataLoader `num_workers` when the settings ask for it.
THROTTLEDJOB_AUTOHOOK=0 (or THROTTLEDJOB_DISABLE=1) turns it off.
"""

from __future__ import annotations

import _thread  # built in, unlike threading: nothing to load
import os
import sys

from throttledjob.contracts.names import ENV_AUTOHOOK, ENV_DIR, ENV_DISABLE

# Every interpreter with the injected library loads this module at start-up: typing and
# importlib.abc (which pulls in importlib.resources, tempfile, pathlib, ...) cost about
# 15 ms there, so neither is imported (type checkers and ruff read this name as typing's).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def enabled(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return (bool(env.get(ENV_DIR))
            and env.get(ENV_AUTOHOOK, "1") not in ("0", "false", "off")
            and env.get(ENV_DISABLE, "") not in ("1", "true"))


def install() -> bool:
    """Watch for `import torch`; True if the hook is active. Never raises."""
    if not enabled():
        return False
    if "torch" in sys.modules:
        _safely(on_torch_imported, sys.modules["torch"])
    elif not any(isinstance(f, _TorchWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchWatcher())
    return True


class _TorchWatcher:
    """A meta path finder that finds nothing itself: it wraps the loader of the spec the
    other finders return for torch, so the hook runs once torch has loaded.

    It stays on sys.meta_path until then: libraries ask `importlib.util.find_spec("torch")`
    before importing it (transformers, accelerate, lightning), and that lookup's spec is
    thrown away, so the watcher must wrap the spec of the real import too.
    """

    def __init__(self) -> None:
        self._looking_up: set[int] = set()  # threads inside our own find_spec below

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch" or _thread.get_ident() in self._looking_up:
            return None
        import importlib.util

        thread = _thread.get_ident()
        self._looking_up.add(thread)
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            self._looking_up.discard(thread)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            # Torch is loaded: hook it once. A failed import leaves the watcher for a retry.
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                _safely(on_torch_imported, module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def on_torch_imported(torch: Any) -> None:
    import importlib

    from throttledjob import runtime as tj

    # Submodules are loaded on first use in recent torch: import what is patched.
    optimizer = importlib.import_module("torch.optim.optimizer")
    dataloader = importlib.import_module("torch.utils.data.dataloader")

    throttle = tj.default()
    throttle.refresh_levers()
    state = {"optimizer_steps": 0}

    def after_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        state["optimizer_steps"] += 1
        throttle.step()

    optimizer.register_optimizer_step_post_hook(after_optimizer_step)
    _pace_dataloader_batches(dataloader, throttle, state)
    _override_dataloader_workers(dataloader, throttle)


def _pace_dataloader_batches(dataloader: Any, throttle: Any, state: dict) -> None:
    """Inference loops have no optimizer: a batch whose processing saw no optimizer step
    is one step, paced when the next batch (or the end) is asked for."""
    iterator_class = dataloader._BaseDataLoaderIter
    original_next = iterator_class.__next__

    def __next__(self: Any) -> Any:
        seen = getattr(self, "_throttledjob_steps_seen", None)
        if seen is not None and seen == state["optimizer_steps"]:
            throttle.step()
        self._throttledjob_steps_seen = state["optimizer_steps"]
        try:
            return original_next(self)
        except StopIteration:
            self._throttledjob_steps_seen = None
            raise

    iterator_class.__next__ = __next__


def _override_dataloader_workers(dataloader: Any, throttle: Any) -> None:
    loader_class = dataloader.DataLoader
    original_init = loader_class.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        workers = throttle.settings.dataloader_workers
        # num_workers is the 6th positional (dataset, batch_size, shuffle, sampler,
        # batch_sampler come first): one given there is left alone.
        if workers is not None and len(args) < 6:
            kwargs["num_workers"] = workers
            if workers == 0:
                # Options for worker processes, which torch refuses without any (a
                # ValueError in the user's code): they have nothing to act on.
                kwargs.pop("persistent_workers", None)
                kwargs.pop("prefetch_factor", None)
        original_init(self, *args, **kwargs)

    loader_class.__init__ = __init__


def _safely(fn: Any, *args: Any) -> None:
    """The hook must never break the program that loaded it."""
    try:
        fn(*args)
    except Exception as e:
        sys.stderr.write(f"throttledjob: auto-hook disabled: {e!r}\n")
