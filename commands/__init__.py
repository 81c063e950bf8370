"""What starts things: the `brorl` command and its argument checks, the Prefect server, the
scheduled deployments and the MLflow UI. Entry points import flows, tasks, tracking and brorl;
nothing imports them (tests/test_layering.py)."""
