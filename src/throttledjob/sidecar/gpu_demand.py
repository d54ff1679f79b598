"""What a GPU would draw unheld: a ThrottleBudget's measure of a member's GPU demand
(`gpuDemandHistory` in /status), as the CPU's is its use plus what the quota held back.

Under a power cap a board reads at its cap, so its power says nothing of its need; its
utilization does not fall under a cap (kernels run longer at the lower clock). Holding the
workload back (the duty) lowers both, in proportion. So, with the board's floor (its idle
draw, once read; 0 until then, as the duty's law takes it) and its top (the most its
limit lets it draw):
- capped: floor + (top - floor) x utilization / (1 - duty), the draw of a board this busy
  at full clock;
- not capped: floor + (power - floor) / (1 - duty), what it draws with the hold-back gone;
never under what it draws now, never over its top.
"""

from __future__ import annotations

from throttledjob.gpu.backend import GpuReading

# A duty over this is not divided by: a workload held back nearly whole says little of
# what it would draw unheld, and a small error in the duty would swing the figure.
MAX_DUTY = 0.9


def uncapped_watts(r: GpuReading, duty: float, floor_watts: float | None,
                   top_watts: float | None) -> float | None:
    """The board's draw with no cap and no hold-back (None: no power reading)."""
    if r.power_watts is None:
        return None
    free = 1.0 - min(MAX_DUTY, max(0.0, duty))
    floor = min(floor_watts or 0.0, r.power_watts)
    top = max(top_watts or r.power_watts, r.power_watts)
    if "sw_power_cap" in r.throttle_reasons:
        wanted = floor + (top - floor) * min(1.0, r.utilization_ratio / free)
    else:
        wanted = floor + (r.power_watts - floor) / free
    return min(top, max(r.power_watts, wanted))
