"""A process tree for the agent with no processes behind it."""

from __future__ import annotations


class FakeTree:
    """A process tree whose CPU time the test sets (`cpu`): the agent's view, no processes."""

    def __init__(self) -> None:
        self.cpu = 0.0

    def refresh(self) -> None:
        pass

    def cpu_seconds(self) -> float:
        return self.cpu

    def pids(self) -> list[int]:
        return []
