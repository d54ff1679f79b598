"""The kernel's CPU quota (CFS bandwidth control), one module a job:

- `fs`: cgroupfs itself: which cgroups a process is in (/proc/PID/cgroup, mountinfo),
  where their directories are, a pod's cgroup, the quota files read and written;
- `throttling`: the kernel's counters of a cgroup (`ThrottleStats`, cpu.stat) and the one
  account of them (`ThrottleAccount`: time held back and width since a baseline);
- `detection`: whether this machine lets a run put a quota on a cgroup of its own
  (`detect`);
- `local_quota`: that quota on the command's process tree in local mode (`CgroupQuota`,
  orphan sweeping);
- `container_quota`: the read-only view of a pod's workload containers' quota
  (`ContainerQuota`).

Nothing is imported here: `processes` imports `fs`, and `local_quota` imports `processes`.
"""
