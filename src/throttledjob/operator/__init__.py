"""ThrottledJob operator: kopf handlers that build a Job and its sidecar and report status."""
