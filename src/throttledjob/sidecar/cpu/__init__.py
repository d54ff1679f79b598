"""The sidecar's CPU half, in a room of its own: how the CPU target is measured and held
changes here, and a reader of the GPU half (../gpu_*.py) or of the loop both share
(../agent.py) need not open it. The GPU half holds a board back through it (its duty
becomes a rate in decide.py), and imports none of it (tests/test_layers.py).

measure.py, decide.py, act.py  the CPU's part of a cycle, which ../agent.py sequences: a
                               `Sample`, the rate and the budget's verdict, the settings
                               file and the enforcer
controller.py                  the rate law (pure)
enforcement.py                 the plan: which lever holds the target, each fallback's reason
enforcer.py, lease.py, guard.py  SIGSTOP/SIGCONT, the lease that announces each stop, and
                               the guard (`tj-guard`) that keeps its promise
cgroups/                       the kernel's quota
processes.py                   the workload's process tree
lever_settings.py, explorer.py, exploration_cost.py, lever_choice.py, lever_time.py
                               the cooperative levers and the explorer that chooses them
os_levers.py                   nice and CPU affinity
"""
