"""Where brorl runs: the process environment, the checkout, local servers, devices.

- `environment`: offline, no telemetry, caches under .cache/, pinned math-library paths;
- `checkout`: the checkout a command works in;
- `servers`: local servers (Prefect, MLflow, PostgreSQL) started and always stopped;
- `devices`: the accelerators a run may use.
"""
