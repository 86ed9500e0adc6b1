"""Waiting on states with a deadline: the tests' only way to synchronise with other processes.

It lives in ``powerfleet.testing.waiting`` (bench/ uses it too and never imports tests/)."""

from powerfleet.testing.waiting import wait_for

__all__ = ["wait_for"]
