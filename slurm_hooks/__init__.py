"""Slurm entry points: Prolog, Epilog and HealthCheckProgram."""
