"""What `medic report` cannot know (remediation.report prints it under every report)."""

from __future__ import annotations

CANNOT_KNOW = (
    "detection: only a fault whose sensor dates it has one (fault_at): an XID or other"
    " fault in the kernel log (its timestamp, which drifts from the wall clock with uptime)"
    " and a hang (its last step); NVML events (XIDs by NVML alone, ECC, the GPU checks) and"
    " the other checks carry no time of their own: their detection is unknown, not 0",
    "isolation ends at the job_action record, taken when Slurm's requeue call returned"
    " (after the drain, before the job is made eligible again); known_at is when the daemon"
    " began its answer, a few ms after its check saw the fault (a store's earlier fault"
    " event is used when there is one)",
    "running again is the job's first prolog allowed after the requeue (the first node's),"
    " not the moment every node of the job started",
    "restart and lost work need the checkpoint helper's records (its ledger, or for jobs"
    " from before it the manifests and resume marks left): jobs without them show these as"
    " unknown, and their ETTR is an upper bound",
    "reload is the part of restart that latest() spent finding and verifying the step (a"
    " node-local copy: reading and hashing all of it; a durable one: by size unless"
    " verify_hashes); the job's own loading after latest() returns is not in any component",
    "a job that was never interrupted leaves no record that it was resilient: only"
    " interrupted jobs are listed",
    "node-hours count every node of the fleet for the whole window, in service or not",
    "a reboot recorded before the ladder noted the new boot has no measured duration",
    "a false ejection is an episode resolved by its re-qualification (requalify_checks: the"
    " deep tier where configured) with no repair run, no failed re-qualification and no RMA",
)
