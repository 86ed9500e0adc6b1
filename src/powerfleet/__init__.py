"""powerfleet: a Celery worker fleet for GPU power budgets and KV-router retuning."""

__version__ = "0.1.0"
