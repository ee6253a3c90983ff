"""The compiled front of the Prolog and Epilog (medic_hook.c) and its build."""
