"""ThrottledJob: shave the CPU and GPU peaks of batch and ML jobs to a target."""

__version__ = "0.1.0"
