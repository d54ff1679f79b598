"""A board's power limit, as both its cappers see it: the pod's sidecar (its lever,
sidecar/gpu_power_cap.py) and the node agent that sets a cap for it (node/caps.py).
"""

from __future__ import annotations

# NVML keeps a limit in milliwatts: a limit read within this of one set is that one.
SAME_WATTS = 0.5


def capped_limit(target: float, original: float, span: tuple[float, float]) -> float:
    """The limit that caps a board at `target`: within its range (min, max), and never
    over the limit it had, which a cap must not raise."""
    return min(original, span[1], max(span[0], target))
