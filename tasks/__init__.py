"""Prefect tasks: each a thin wrapper around one brorl call; inputs and outputs are paths or small values."""
