"""Thin Celery tasks: decode JSON arguments, build ports, call domain code, return JSON."""
