"""Pieces every part of Medic shares: the subprocess gateway, configuration, node identity."""
