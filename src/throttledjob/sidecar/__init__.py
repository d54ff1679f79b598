"""ThrottledJob sidecar: measure, decide, throttle; local mode and pod mode.

In rooms by resource, so that a change to how one resource is held is made in its room:
here the loop both halves share (agent.py's cycle and record.py's record of it, loop.py,
the hosts local.py and pod.py, what /status, /metrics and --report read, and the rules
both explorers share: stats.py, phase_gate.py); cpu/ the CPU half; gpu_*.py the GPU half,
over the device layer (throttledjob.gpu; its map is in gpu_agent.py).
"""
