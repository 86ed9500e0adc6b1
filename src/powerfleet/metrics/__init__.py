"""Prometheus metrics. Import only after ``prepare_multiprocess`` where a process forks children.

prometheus_client picks its value store at import time, so a prefork worker must set
PROMETHEUS_MULTIPROC_DIR before the first import, or outcomes counted in its children
would never reach the parent's /metrics.
"""
