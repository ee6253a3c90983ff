"""The remediation ladder: GPU reset, driver reload, reboot, RMA ticket.

`remediation.tickets` keeps RMA tickets (state machine, audit trail, re-qualification flag)
and `remediation.webhook` notifies the site's ticketing system of their changes.
"""
