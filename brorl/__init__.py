"""brorl: scaling RLVR by broadened exploration (BroRL, Hu et al. 2025, arXiv 2510.01180).

The library is pure and importable without prefect, mlflow or dvc; heavy optional imports
(vllm, deepspeed) happen inside the modules that need them.
"""

__version__ = "0.1.0"
