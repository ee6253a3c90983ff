"""`medic lab`: a real Slurm cluster with simulated GPUs on one machine."""
