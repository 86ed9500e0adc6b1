"""powerfleet.power: measured-power oversubscription (docs/power.md).

* ``safe.py``: the deterministic safe caps of the fallback and the refusal of a group that
  cannot meet its limit even at every GPU's minimum;
* ``guard.py``: the guard, one pure controller per group and period;
* ``whatif.py`` / ``report.py``: traffic replayed under the guard (``powerfleet power
  whatif``) and its JSON contract ``powerfleet.power.whatif/v1``.
"""
