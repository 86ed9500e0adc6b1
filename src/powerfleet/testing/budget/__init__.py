"""The budget's test world: the routes' cluster, the stand-in operator and the exploration's state machine
(tests/budget/test_explore.py bounded, bench/budget_explore.py long)."""
