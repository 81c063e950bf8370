"""Prefect flows: composition only (load params, open the MLflow run, call tasks, summarise)."""
