"""What starts things: the `brorl` command, `python -m flows.NAME`'s argument checks, the Prefect
server, the scheduled deployments and the MLflow UI. Entry points import flows, tasks, tracking
and brorl; nothing imports them but a flow module's `if __name__ == "__main__":` block
(tests/test_layering.py)."""
