"""Names the parts agree on: environment variables and files in the shared directory."""

# Set in the workload's environment by the operator or `throttledjob run`: the shared
# directory. Without it the runtime library does nothing.
ENV_DIR = "THROTTLEDJOB_DIR"
# "1"/"true": the runtime library does nothing even with ENV_DIR set.
ENV_DISABLE = "THROTTLEDJOB_DISABLE"
# "open" (default) or "hold": what the runtime does when the settings file goes stale.
ENV_ON_STALE = "THROTTLEDJOB_ON_STALE"
# "0"/"false"/"off": the injected start-up hook leaves the process alone.
ENV_AUTOHOOK = "THROTTLEDJOB_AUTOHOOK"
# Set on each workload container by the operator: its name, which the sidecar reads from
# /proc/PID/environ to say how much CPU each container wanted (cpuDemandCores in /status).
ENV_CONTAINER = "THROTTLEDJOB_CONTAINER"
# The user's own PYTHONPATH, kept by the operator when it prepends the injected library.
ENV_USER_PYTHONPATH = "THROTTLEDJOB_USER_PYTHONPATH"

# In the shared directory: one settings file (sidecar -> workload) and one progress file
# per cooperating process (workload -> sidecar), named PROGRESS_PREFIX + PID + ".json".
SETTINGS_FILE = "settings.json"
PROGRESS_PREFIX = "progress-"
# Sidecar -> guard: before the signal enforcer stops the workload it writes which pids it
# stops and until when (sidecar/cpu/lease.py); the guard resumes them if that moment passes.
STOP_LEASE_FILE = "stop-lease"
# The guard's process name (prctl PR_SET_NAME): it shares the pod's process namespace and
# cgroup with the workload, and the sidecar must never count it as the workload (it
# would stop the guard with everything else).
GUARD_PROCESS_NAME = "tj-guard"

# `--gpu-backend`: the node agent's socket where it is there, else NVML where present,
# else none (auto); the node agent, NVML, simulated GPUs, none. Here so that the command
# line offers them without importing the sidecar's GPU half.
GPU_BACKENDS = ("auto", "node", "nvml", "fake", "none")
# Where the sidecar finds the node agent (`throttledjob node`): its socket in the pod's
# CSI volume of the agent's driver (node/csi.py), unless THROTTLEDJOB_NODE_SOCKET says
# otherwise.
NODE_CSI_DRIVER = "node.throttledjob.io"
# The volume's attribute by which the operator tells the agent that the pod's ThrottledJob
# allows the power cap (levers.gpuPowerLimit: Allow): "true"; the agent refuses a cap
# without it. Only the operator's pods may carry the volume (the chart's admission policy).
NODE_POWER_CAP_ATTRIBUTE = "powerCap"
# The extended resource a pod's GPUs are requested as (NVIDIA's device plugin's).
GPU_RESOURCE = "nvidia.com/gpu"
NODE_SOCKET_DIR = "/run/throttledjob/node"
NODE_SOCKET = f"{NODE_SOCKET_DIR}/agent.sock"
ENV_NODE_SOCKET = "THROTTLEDJOB_NODE_SOCKET"
