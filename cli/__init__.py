"""The admin CLI `medic`."""
