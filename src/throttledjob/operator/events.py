"""The operator's Normal events. kopf posts its own log lines as Events at its posting
level ("Handler 'ensure' succeeded.", "Resuming is processed: ...": two on every
ThrottledJob at every restart, finished ones too); the operator sets that level to
WARNING and posts its own Normal events here, which the level does not filter. Warnings
stay kopf.warn."""

from __future__ import annotations

from typing import Any

import kopf


def normal(obj: Any, reason: str, message: str) -> None:
    """A Normal event on `obj` (a kopf body or an object dict)."""
    kopf.event(obj, type="Normal", reason=reason, message=message)
