"""powerfleet.agent: the GPU node agent that enforces pod power-cap annotations (docs/agent.md).

Domain modules (gpu, cgroup, podmap, policy, apply, state, recovery, reconcile) know nothing
of Celery; runtime/build/worker put them in an agent worker process; presence is shared with
the tick and the CLI.
"""
