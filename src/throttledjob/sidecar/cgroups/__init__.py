"""The kernel's CPU quota (CFS bandwidth control), one module a job:

- `fs`: cgroupfs itself: which cgroup a process is in (/proc/PID/cgroup, mountinfo),
  where that cgroup's directory is, a pod's cgroup, and the quota files read and written;
- `throttling`: the kernel's counters of a cgroup (`ThrottleStats`, cpu.stat) and the one
  account of them (`ThrottleAccount`: time held back and width since a baseline);
- `local_quota`: a quota of our own on the command's process tree in local mode
  (`detect`, `CgroupQuota`, orphan sweeping);
- `container_quota`: the read-only view of a pod's workload containers' quota
  (`ContainerQuota`).

Nothing is imported here: `processes` imports `fs`, and `local_quota` imports `processes`.
"""
