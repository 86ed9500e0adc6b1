"""Broker plumbing: the embedded private redis-server used when no broker URL is configured."""
