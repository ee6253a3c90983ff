"""The NVML injection library: NVIDIA's NVML symbols served from a scenario file."""
