"""The remediation ladder: GPU reset, driver reload, reboot, RMA ticket."""
