"""ThrottledJob sidecar: measure, decide, throttle; local mode and pod mode."""
