"""The node health daemon: launch, periodic and deep checks, NVML events, kernel log."""
