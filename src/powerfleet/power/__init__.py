"""powerfleet.power: measured-power oversubscription (docs/power.md).

* ``safe.py``: the deterministic safe caps of the fallback and the refusal of a group that
  cannot meet its limit even at every GPU's minimum;
* ``guard.py``: the guard, one pure controller per group and period;
* ``overlay.py``: the guard's overlay to one node and the cap an agent enforces with it;
* ``whatif.py`` / ``report.py`` / ``inputs.py``: traffic replayed under the guard
  (``powerfleet power whatif``), its JSON contract ``powerfleet.power.whatif/v1`` and its
  option parsers;
* ``live.py`` / ``telemetry.py`` / ``topology.py`` / ``metrics.py``: the live guard's period, the
  agents' reports it reads, the group's nodes and priorities, its metrics (the task is
  tasks/power.py; the agent's side agent/throttle.py);
* ``admission.py``: admission to an oversubscribed group.
"""
