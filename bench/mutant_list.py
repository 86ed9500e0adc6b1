"""The fixed list of mutants for bench/mutants.py: realistic bugs in the safety-critical code.

Each is a bug someone could plausibly write, and each hides a failure an operator would feel
(a cap lifted, a budget exceeded, a stale leader writing, a pickled message run). ``original``
must occur exactly once in ``file``; when the code moves on, the run stops and names the
mutant to update here. ``tests``: the files that should catch it, kept few so a run stays short
(the unit-level file of the area first; pytest -x stops at the first failure).

The mutants marked ``#24 survivor`` are the eight bugs issue 24 found uncaught; their names
start with ``s<N>.`` in the issue's numbering (survivor 1 twice: the `agent once` lister and the
worker's watch-backed pod view both merge several namespaces).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    bug: str


AGENT = ("tests/agent/test_policy.py", "tests/agent/test_reconcile.py", "tests/agent/test_state.py",
         "tests/agent/test_recovery_shutdown.py", "tests/agent/test_partial_failures.py")
LEDGER = ("tests/budget/test_ledger.py",)  # the charge of what holds GPUs, group shares (issue 24's 4 and 5)
BUDGET = ("tests/budget/test_program.py", "tests/budget/test_groups.py", "tests/budget/test_planner.py")
RETUNE_CUT = ("tests/retune/test_cut.py",)
LEADERSHIP = ("tests/retune/test_leadership.py",)
SAVED_TERM = ("tests/retune/test_state_and_settings.py", *LEADERSHIP)  # issue 24's 3: the saved state's term
WINDOWS = ("tests/unit/test_windows.py",)
ROUTES = ("tests/unit/test_tasks_and_routes.py", "tests/integration/test_routing.py")
POWER = ("tests/agent/test_throttle.py", "tests/power/test_sensor_faults.py", "tests/power/test_authority.py",
         "tests/power/test_live.py")

MUTANTS: tuple[Mutant, ...] = (
    # -- the cap policy --
    Mutant(
        "policy.conflict_takes_highest", "src/powerfleet/agent/policy.py",
        "chosen = min(candidates)",
        "chosen = max(candidates)",
        AGENT, "pods that disagree on a shared GPU get the highest request instead of the lowest valid one "
               "(or the safe default)"),
    Mutant(
        "policy.unannotated_peer_ignored", "src/powerfleet/agent/policy.py",
        "if not missing and not invalid and not unknown and len(distinct) == 1:",
        "if not invalid and not unknown and len(distinct) == 1:",
        AGENT, "a pod without the annotation sharing a GPU is ignored: the others' cap applies to it"),
    Mutant(
        "policy.invalid_single_released", "src/powerfleet/agent/policy.py",
        "        if mw is None:\n            return Decision(Kind.SAFE_DEFAULT, uids, safe_default_mw,",
        "        if mw is None:\n            return Decision(Kind.RELEASE, uids, None,",
        AGENT, "a pod with an invalid annotation gets the GPU's default limit instead of the safe default"),
    # -- clamp and apply --
    Mutant(
        "clamp.no_lower_bound", "src/powerfleet/agent/reconcile.py",  # apply.clamp has no caller any more
        "return min(max(self.d.requested_mw, self.min_mw), self.max_mw)",
        "return min(self.d.requested_mw, self.max_mw)",
        AGENT, "a cap below the device minimum is sent to NVML as is (refused there, GPU left uncapped)"),
    Mutant(
        "apply.read_back_unchecked", "src/powerfleet/agent/apply.py",
        "if now != cap_mw:",
        "if now is None:",
        AGENT, "a set the device did not take is recorded as applied and the GPU as managed"),
    # -- fail-safe --
    Mutant(
        "failsafe.pod_list_failure_carries_on", "src/powerfleet/agent/reconcile.py",
        "        if pods is None:\n            return self._skip(trigger, dry_run, why)\n",
        "        if pods is None:\n            pods = []\n",
        AGENT, "a failed pod LIST runs the pass with no pods: every capped GPU is released"),
    Mutant(
        "failsafe.release_unmanaged_gpu", "src/powerfleet/agent/reconcile.py",
        "            if r.uuid not in self.managed:\n"
        "                if not dry_run:\n                    self.failing.worked(r.uuid)\n"
        "                return out  # not ours: leave whatever limit it has\n",
        "",
        AGENT, "a GPU this agent never capped is reset to its default (another tool's limit is lost)"),
    Mutant(
        "recovery.drops_on_incomplete_scan", "src/powerfleet/agent/lifecycle.py",
        "        if complete and not self._recovered:",
        "        if not self._recovered:",
        AGENT, "a GPU that could not be read at startup is forgotten: its cap is never restored"),
    # -- the state file --
    Mutant(
        "state.corrupt_file_is_empty", "src/powerfleet/agent/state.py",
        'return _bad(f"not JSON ({exc})")',
        'return LoadedState(problem=f"not JSON ({exc})")',
        AGENT, "a corrupt state file reads as 'nothing managed': orphaned caps are never restored"),
    # -- issue 32: the write-ahead record, owners, failing GPUs, UUIDs; issue 37 survivor 1 --
    Mutant(
        "state.no_write_ahead", "src/powerfleet/agent/lifecycle.py",
        "        new = {p.r.uuid for p in caps} - self._durable\n",
        "        new = set()\n",
        ("tests/agent/test_write_ahead.py",), "a GPU is capped before any record owns it: a kill before the save "
                                              "leaves the cap on the next tenant"),
    Mutant(
        "ownership.finished_pods_live", "src/powerfleet/agent/ownership.py",
        "    return [p for p in pods if p.phase not in TERMINAL_PHASES]",
        "    return list(pods)",
        ("tests/agent/test_ownership.py",), "a Succeeded pod's allocation (still listed by the kubelet) caps the "
                                            "GPU's next tenant"),
    Mutant(
        "ownership.idle_cap_outlives_its_pods", "src/powerfleet/agent/reconcile.py",
        "        if d.kind is Kind.IDLE and r.uuid in self.managed and not owners_alive(",
        "        if False and d.kind is Kind.IDLE and r.uuid in self.managed and not owners_alive(",
        ("tests/agent/test_ownership.py", "tests/agent/test_recovery_shutdown.py"),
        "an idle GPU keeps the cap of a deleted pod until the agent restarts"),
    Mutant(
        "failing.never_excluded", "src/powerfleet/agent/failing.py",
        "excluded = kind in EXCLUDABLE and prev.passes >= EXCLUDE_AFTER",
        "excluded = False",
        ("tests/agent/test_failing_gpus.py",), "one lost GPU keeps the node NotReady forever (a rollout stalls)"),
    Mutant(
        "nvml.set_by_index", "src/powerfleet/agent/nvml.py",
        "                return op(self._handle_of(index, uuid))\n",
        "                return op(self._handle(index))\n",
        ("tests/agent/test_write_ahead.py",), "after a re-enumeration the set caps whatever GPU has the index"),
    Mutant(
        "lock.boot_id_not_compared", "src/powerfleet/agent/lock.py",
        '    if not me.get("boot") or holder.get("boot") != me.get("boot"):',
        '    if not me.get("boot"):',
        ("tests/agent/test_lock.py",), "#37 survivor 1: a live agent on another boot is taken over when its pid "
                                       "is absent here: two agents cap one node"),
    # -- issue 32: MPS attribution and the unknown owner --
    Mutant(
        "attribution.mps_clients_never_known", "src/powerfleet/agent/attribution.py",
        "    clients_known = bool(owners) or r.mps_pids is not None\n",
        "    clients_known = False\n",
        ("tests/agent/test_mps.py",), "an MPS server's clients never decide its GPU: agreeing 600 W clients get the "
                                      "safe default"),
    Mutant(
        "policy.unknown_owner_held", "src/powerfleet/agent/policy.py",
        "        if unknown and blind:\n",
        "        if unknown:\n",
        ("tests/agent/test_policy.py", "tests/agent/test_mps.py"), "a GPU used by an unknown owner keeps whatever "
                                                                   "limit it has (uncapped) instead of the safe default"),
    Mutant(
        "s8.no_fsync_before_rename", "src/powerfleet/agent/files.py",
        "            if durable:\n                os.fsync(out.fileno())\n        os.replace(tmp, path)",
        "            if durable:\n                pass\n        os.replace(tmp, path)",
        ("tests/agent/test_state.py", "tests/agent/test_simulated.py"),
        "#24 survivor 8: the state file is renamed before its data is on disk (empty after a crash)"),
    Mutant(
        "s1.partial_pod_list_lifts_caps", "src/powerfleet/agent/build.py",
        "        for ns in namespaces:\n"
        "            out.extend(cluster.list_pods(ns, node_name=node))\n        return out\n",
        "        failed = 0\n        for ns in namespaces:\n            try:\n"
        "                out.extend(cluster.list_pods(ns, node_name=node))\n            except Exception:\n"
        "                failed += 1\n        if failed == len(namespaces):\n"
        "            raise RuntimeError('every namespace failed')\n        return out\n",
        ("tests/agent/test_build.py", *AGENT),
        "#24 survivor 1: with several agent.namespaces a pass carries on when some LISTs fail (caps lifted)"),
    Mutant(  # the same bug in the worker's watch-backed pod view (build.pod_view); the lister above serves `agent once`
        "s1.partial_pod_view_lifts_caps", "src/powerfleet/agent/podcache.py",
        "            if stale:\n                raise PodViewStale(",
        "            if len(stale) == len(self._scopes):\n                raise PodViewStale(",
        ("tests/agent/test_build.py", "tests/agent/test_presence_watch.py"),
        "#24 survivor 1, the agent worker's pod view: a pass carries on when some namespaces' LISTs fail"),
    Mutant(
        "s7.draw_metric_in_milliwatts", "src/powerfleet/agent/observe.py",
        "self.metrics.draw.labels(gpu=gpu).set(r.draw_mw / 1000)",
        "self.metrics.draw.labels(gpu=gpu).set(r.draw_mw)",
        ("tests/agent/test_driver_faults.py", *AGENT), "#24 survivor 7: powerfleet_agent_power_draw_watts reports milliwatts"),
    # -- the reconcile tick --
    Mutant(
        "s6.tick_pass_outlives_interval", "src/powerfleet/tasks/fleet.py",
        "fan_out(self.app, nodes, expires=self.app.fleet_config.beat.reconcile_interval_s)",
        "fan_out(self.app, nodes, expires=3 * self.app.fleet_config.beat.reconcile_interval_s)",
        ("tests/integration/test_routing.py", "tests/agent/test_presence_watch.py"),
        "#24 survivor 6: a pass for a node without an agent outlives the next tick (heartbeat TTL, not interval)"),
    # -- budget: planner clamps and staging --
    Mutant(
        "planner.stage_on_settled_not_peak", "src/powerfleet/budget/planner.py",
        "power_over = s.watts()[1] > budget.power_limit_w",
        "power_over = s.watts()[0] > budget.power_limit_w",
        BUDGET, "an opposing rebalance is not staged: its transition peak exceeds the power limit"),
    Mutant(
        "planner.clamp_turns_scale_up_into_scale_down", "src/powerfleet/budget/planner.py",
        "lower[r] = min(upper[r], max(floor, self.cur[r]) if current_fits else floor)",
        "lower[r] = min(upper[r], floor)",
        BUDGET, "a clamped scale-up shrinks a role below its current count though the current state fits"),
    Mutant(
        "planner.refill_undoes_staging", "src/powerfleet/budget/planner.py",
        # the refill now runs before staging, which then holds whatever ups the refill made
        "    _final_refill(s, budget, upper, rolling)\n    _stage(s, budget)\n",
        "    _stage(s, budget)\n    _final_refill(s, budget, upper, rolling)\n",
        BUDGET, "a staged rebalance refills the roles it scales down: the staged scale-ups never get room"),
    Mutant(
        "planner.rollout_hold_needs_every_role", "src/powerfleet/budget/planner.py",
        "rolling = any(f.rolling or f.in_flight for f in roles.values())",
        "rolling = all(f.rolling or f.in_flight for f in roles.values())",
        BUDGET, "a scale-up proceeds while one role's rollout is in flight"),
    Mutant(
        "budget.unreadable_pods_allow_growth", "src/powerfleet/budget/program.py",
        '    if by_comp is None:\n        why.append("pods could not be read")\n    else:\n',
        "    if by_comp is None:\n        pass\n    else:\n",
        BUDGET, "a failed pod LIST no longer blocks scale-ups: growth planned on a draw nobody could read"),
    Mutant(
        "budget.no_group_allowance_grows", "src/powerfleet/budget/program.py",
        'return own, f"group {g.group}: no allowance, scale-ups blocked", True',
        'return own, f"group {g.group}: no allowance, scale-ups blocked", False',
        BUDGET, "a deployment without a group allowance (pods not placed yet) scales up past its rack's budget"),
    Mutant(
        "s4.group_share_ignores_own_limit", "src/powerfleet/budget/groups.py",
        "max(0, min(m.demand_w, m.own_limit_w) - m.minimum_w)",
        "max(0, m.demand_w - m.minimum_w)",
        (*LEDGER, *BUDGET), "#24 survivor 4: a group share is wasted on a deployment capped below it (others starve)"),
    Mutant(
        "s5.surge_pods_not_drawn", "src/powerfleet/budget/fleet.py",
        "charged = role_counts(view.dgd, rp, by_comp.get(rp.component, [])).charged",
        "n = role_counts(view.dgd, rp, by_comp.get(rp.component, []))\n        charged = max(n.desired, n.ready or 0)",
        (*LEDGER, *BUDGET, "tests/budget/test_runner.py"),
        "#24 survivor 5: surge pods beyond the replica count are missing from a deployment's current draw"),
    Mutant(
        "budget.own_shrink_reported_over", "src/powerfleet/budget/program.py",
        "    return g.over_share\n",
        "    return True\n",
        BUDGET, "a deployment shrinking by its own proposal is reported OverBudget (a Warning event and a "
                "condition write each; 316 of 814 on the bench's steady tick)"),
    Mutant(
        "budget.over_share_from_demand", "src/powerfleet/budget/groups.py",
        "over_share=m.current_w > m.minimum_w + held[k])",
        "over_share=m.current_w > m.minimum_w + extra[k])",
        BUDGET, "the fair share that decides 'over' follows what a member asks, not what it holds"),
    Mutant(
        "budget.last_scale_not_carried", "src/powerfleet/budget/runner.py",
        '    if "lastScale" in previous and "lastScale" not in res.status:',
        '    if False and "lastScale" in previous and "lastScale" not in res.status:',
        ("tests/budget/test_runner.py",), "every evaluation after a scale rewrites the status (drops its lastScale)"),
    # -- retune: window arithmetic and the cut --
    Mutant(
        "windows.open_window_counts_as_closed", "src/powerfleet/retune/windows.py",
        "return window(window_at(now, interval_s, phase_s).index - 1, interval_s, phase_s)",
        "return window(window_at(now, interval_s, phase_s).index, interval_s, phase_s)",
        WINDOWS, "the window still in progress is cut and tuned on half its traffic"),
    Mutant(
        "windows.enable_window_not_skipped", "src/powerfleet/retune/windows.py",
        "return window_at(enabled_at, interval_s, phase_s).index + 1",
        "return window_at(enabled_at, interval_s, phase_s).index",
        WINDOWS, "the window in progress when retune was enabled (traffic from before) is launched"),
    Mutant(
        "windows.relaunch_last_window", "src/powerfleet/retune/windows.py",
        "if last_launched is not None and closed.index <= last_launched:",
        "if last_launched is not None and closed.index < last_launched:",
        WINDOWS, "the window just launched is launched again at the next tick"),
    Mutant(
        "s2.truncated_last_member_kept", "src/powerfleet/retune/cut.py",
        "                if not chunk:\n                    break\n                cur += len(chunk)",
        "                if not chunk:\n                    ok = True  # the member ends with the file\n"
        "                    break\n                cur += len(chunk)",
        RETUNE_CUT, "#24 survivor 2: a gzip member cut short at the end of a segment gets into the window"),
    # -- retune: fencing --
    Mutant(
        "fencing.holder_only_check", "src/powerfleet/retune/leadership.py",
        "if lease is None or lease.holder_identity != term.identity or (lease.lease_transitions or 0) != term.term:",
        "if lease is None or lease.holder_identity != term.identity:",
        LEADERSHIP, "a superseded term of the same identity (a restarted leader) still writes"),
    Mutant(
        "fencing.takeover_keeps_term", "src/powerfleet/retune/leadership.py",
        "        elif not lease.holder_identity or self._expired(lease):\n            transitions += 1\n",
        "        elif not lease.holder_identity or self._expired(lease):\n",
        LEADERSHIP, "a takeover keeps the old term: the old leader's late writes are not fenced"),
    Mutant(
        "s3.saved_state_term_unchecked", "src/powerfleet/retune/leadership.py",
        "            if base.term > term.term:\n"
        '                raise Fenced(f"{term.dgd}: saved state carries term {base.term}, later than {term.term}")\n',
        "",
        SAVED_TERM,
        "#24 survivor 3: a write below the saved state's term is accepted after the Lease is recreated lower"),
    # -- serialisation and routing --
    Mutant(
        "serialisation.accepts_pickle", "src/powerfleet/workers/app.py",
        '"accept_content": ["json"],',
        '"accept_content": ["json", "pickle"],',
        ("tests/integration/test_serialisation.py", "tests/unit/test_tasks_and_routes.py"),  # the real refusal first
        "workers accept pickled messages (remote code execution for anyone who can write to Redis)"),
    Mutant(
        "routing.node_name_unchecked", "src/powerfleet/queues.py",
        "        if not is_node_name(node):\n"
        '            raise RoutingError(f"{name}: node {node!r} is not a valid Kubernetes node name")\n',
        "",
        ROUTES, "any string (a heartbeat key, a typo) becomes a node queue and a Redis key"),
    Mutant(
        "routing.any_node_queue_is_fleet", "src/powerfleet/queues.py",
        "return queue.startswith(NODE_QUEUE_PREFIX) and is_node_name(queue[len(NODE_QUEUE_PREFIX):])",
        "return queue.startswith(NODE_QUEUE_PREFIX)",
        ROUTES, "`trigger --queue` and workers accept node.<anything> as a fleet queue"),
    Mutant(
        "routing.sweep_family_to_control", "src/powerfleet/queues.py",
        '    if task_name.startswith("powerfleet.sweep."):\n        return "sweep"\n',
        "",
        ROUTES, "sweep shards (minutes of CPU each) land on control workers and delay every tick"),
    Mutant(
        "routing.agent_trusts_the_queue", "src/powerfleet/tasks/agent.py",
        "    if not rt.serves(params.node):",
        '    if queue is not None and not rt.serves(queue.removeprefix("node.")):',
        ("tests/agent/test_agent_workers.py::test_an_agent_runs_only_its_own_nodes_work_and_keeps_its_own_binding",),
        "an agent runs a pass for another node when the message reached its queue (its caps, their pods)"),
    # -- retune: issue 33 and issue 37's survivors 2-4 --
    Mutant(
        "i33.selection_uncorrected", "src/powerfleet/retune/decision.py",
        "confs = maxt_confidence([c.batches for c in order], probe.batches, direction == MAXIMIZE)",
        "confs = [maxt_confidence([c.batches], probe.batches, direction == MAXIMIZE)[0] for c in order]",
        ("tests/retune/test_selection.py",),
        "each candidate tested alone: the best of 108 noise candidates applies in about 90 % of windows"),
    Mutant(
        "s37-2.state_conflict_fences_at_once", "src/powerfleet/retune/leadership.py",
        "                if attempt == STATE_ATTEMPTS:",
        "                if attempt == 1:",
        LEADERSHIP, "#37 survivor 2: one resourceVersion conflict on the state Lease loses the leader's update"),
    Mutant(
        "s37-3.dwell_one_window_short", "src/powerfleet/retune/guard.py",
        "k - m.window > dwell_windows",
        "k - m.window >= dwell_windows",
        ("tests/retune/test_guard.py",), "#37 survivor 3: a knob moved at window 10 moves back at 13"),
    Mutant(
        "i33.dwell_counted_in_windows", "src/powerfleet/retune/settings.py",
        'dwell_windows=m["dwell_s"] // m["window_interval_s"]),',
        'dwell_windows=m["dwell_s"]),',
        ("tests/retune/test_guard.py",), "retune.dwell_s read as windows: a 60 s dwell holds a knob 60 windows"),
    Mutant(
        "s37-4.mean_alone_moves", "src/powerfleet/retune/decision.py",
        "    if guard.confidence > 0 and conf is None:\n"
        '        return (f"it has no paired confidence (fewer than {MIN_PAIRS} complete batch pairs with the probe); "\n'
        '                "the mean alone never moves a knob")\n'
        "    if guard.confidence > 0 and conf < guard.confidence:  # type: ignore[operator]\n",
        "    if guard.confidence > 0 and conf is not None and conf < guard.confidence:\n",
        ("tests/retune/test_guard.py",),
        "#37 survivor 4: a candidate without a paired confidence applies on its mean gain alone"),
    Mutant(
        "i33.harvest_ignores_the_uid", "src/powerfleet/retune/harvest.py",
        "        if rec.dgd_uid and rec.dgd_uid != dep.uid:",
        "        if False:",
        ("tests/retune/test_recreated_race.py",),
        "a deleted DGD's sweep is decided into, and PATCHed onto, the DGD recreated under its name"),
    Mutant(
        "i33.gap_not_recorded", "src/powerfleet/retune/accounting.py",
        "        state = _skip_gap(dep, t, state, w.index, now)\n",
        "",
        ("tests/retune/test_accounting.py",), "windows closed during a tick outage get no outcome and no count"),
    # -- the power guard and its overlays (issue 31; issue 29 item 2; issue 37 finding 5) --
    Mutant(
        "power.fallback_skips_unthrottled", "src/powerfleet/power/overlay.py",
        "    if not fresh:\n        return AgentCap(min(annotation_w, overlay.safe[gpu]), \"fallback\")",
        "    if not fresh and gpu in overlay.caps:\n        return AgentCap(min(annotation_w, overlay.safe[gpu]), \"fallback\")",
        POWER, "#37 finding 5: once the overlays stop, a GPU the last overlay left unthrottled keeps its annotation cap"),
    Mutant(
        "power.lost_gpu_at_safe_cap", "src/powerfleet/power/guard.py",
        "lost = {g: max(safe[g], by[g].enforced_w or 0.0) for g in stale}",
        "lost = {g: safe[g] for g in stale}",
        POWER, "a dead agent's GPUs are counted at safe caps nobody enforces while NVML keeps 700 W"),
    Mutant(
        "power.zero_reading_trusted", "src/powerfleet/power/sensors.py",
        "        if d < floor_w:\n",
        "        if d < 0:\n",
        POWER, "a sensor reading 0 W is believed: the guard hands the group's room to the others"),
    Mutant(
        "power.future_revision_accepted", "src/powerfleet/power/authority.py",
        '    if message.revision > rec.revision:\n        return None, "future_revision"\n',
        "",
        POWER, "a message from the future (revision 10^18) is applied with the record's caps and blocks nothing, "
               "but is not refused or counted"),
    # -- the guard's bounds under slip and its default ceiling (issue 31 item 3) --
    Mutant(
        "power.late_overlay_trusted_from_arrival", "src/powerfleet/agent/throttle.py",
        "            self._held[overlay.group] = Held(overlay, now - age)",
        "            self._held[overlay.group] = Held(overlay, now)",
        ("tests/power/test_guard_timing.py",),
        "a message delivered late is trusted for 1.5 periods from its arrival: a skipped guard period adds "
        "seconds over the limit"),
    Mutant(
        "power.no_default_ceiling", "src/powerfleet/power/guard.py",
        "DEFAULT_CAP_CEILING = 1.25\n",
        "DEFAULT_CAP_CEILING = None\n",
        ("tests/power/test_cap_ceiling.py",),
        "no ceiling by default: an overshoot is bounded only by the ratio (50 % of the limit at 1.5x)"),
    # -- the task trust boundary and evaluation generations (issue 29; issue 37 item 4) --
    Mutant(
        "trust.internal_task_by_hand", "src/powerfleet/workers/app.py",
        "        if task_api:\n            _refuse_internal(self, name, task, kwargs)\n",
        "",
        ("tests/unit/test_task_trust.py",), "trigger and Flower send an internal task (agent.throttle, power.guard) "
                                            "or a tick's own field by hand"),
    Mutant(
        "trust.lax_decoding", "src/powerfleet/tasks/base.py",
        "model.model_validate_json(text, strict=True, context=context)",
        "model.model_validate_json(text, strict=False, context=context)",
        ("tests/unit/test_task_trust.py",), 'a task argument is coerced, not refused: {"worker": true} is stored as '
                                            '1 replica, "window": "5" as window 5'),
    Mutant(
        "generations.older_tick_applies", "src/powerfleet/budget/generations.py",
        "    if got.sent < got.newest:\n        return _superseded(got.sent, got.newest)\n",
        "",
        ("tests/budget/test_generations.py",), "a late or retried evaluation of an older tick applies its allowance "
                                               "after a newer tick has re-divided the rack"),
    Mutant(
        "generations.prewrite_fence_dropped", "src/powerfleet/budget/runner.py",
        "    if fence is not None and (why := fence()) is not None:",
        "    if False and fence is not None and (why := fence()) is not None:",
        ("tests/budget/test_generations_prewrite_fence.py",),
        "a batch's later deployment is written under its tick's allowance after a newer tick opened "
        "and re-divided the rack (its DGD unchanged, so its resourceVersion fence lets the write through)"),
    Mutant(
        "outage.store_not_retried", "src/powerfleet/broker/outage.py",
        "            except self.connection_errors as exc:\n                if delay is None:",
        "            except self.connection_errors as exc:\n                if True:",
        ("tests/reliability/test_outage_mid_task.py",),
        "a result stored as the broker's Redis goes is dropped at once instead of waiting out a short "
        "outage (a Sentinel failover): the tick's FAILURE never lands"),
    Mutant(
        "outage.lost_redis_unexpected", "src/powerfleet/workers/outcomes.py",
        "    throws = (RedisUnreachable,)",
        "    throws = ()",
        ("tests/reliability/test_outage_mid_task.py",),
        "a task whose Redis went away mid-task is logged 'raised unexpected' with a traceback (a storm in "
        "an outage, and the demo's no_unexpected_task_failures)"),
    Mutant(
        "outage.failed_ack_traceback", "src/powerfleet/workers/logging.py",
        '_ACK_PREFIXES = ("Couldn\'t ack", "Couldn\'t reject")',
        '_ACK_PREFIXES = ("Couldn\'t reject",)',
        ("tests/reliability/test_failed_ack_line.py",),
        "an ack that meets a stopped broker is logged CRITICAL with kombu's traceback (an outage read as a crash)"),
    Mutant(
        "guard_loop.deadlines_drift", "src/powerfleet/power/loop.py",
        "        missed = deadlines.advance(monotonic())",
        "        deadlines.start = monotonic() - deadlines.index * period_s\n"
        "        missed = deadlines.advance(monotonic())",
        ("tests/power/test_guard_process.py",),
        "the guard process times each period from the end of the last one: its periods drift by every "
        "run's length, a period late each few under load"),
    Mutant(
        "guard_loop.missed_bunched", "src/powerfleet/power/loop.py",
        "        nxt = max(self.index + 1, behind + 1)",
        "        nxt = self.index + 1",
        ("tests/power/test_guard_process.py",),
        "after a stall the guard process runs every missed period back to back (a burst of overlays on "
        "old readings) instead of skipping to the next deadline"),
    Mutant(
        "agent.tick_dropped_when_busy", "src/powerfleet/agent/runtime.py",
        "        if not self._lock.acquire(timeout=self.tick_wait_s):",
        "        if not self._lock.acquire(blocking=False):",
        ("tests/agent/test_runtime.py",),
        "a tick (or a guard overlay) that meets a process poll or a running pass gets no pass of its own "
        "at once: the overlay waits a whole interval"),
    Mutant(
        "agent.deferred_tick_lost", "src/powerfleet/agent/runtime.py",
        "                self._tick_owed = True",
        "                pass",
        ("tests/agent/test_runtime.py",),
        "a tick deferred past its wait is never run: the change it came for (an overlay) waits for the "
        "next tick"),
    Mutant(
        "agent.watch_without_bookmarks", "src/powerfleet/agent/podcache.py",
        "timeout_seconds=timeout, bookmarks=True,",
        "timeout_seconds=timeout, bookmarks=False,",
        ("tests/agent/test_presence_watch.py",),
        "the pod watch asks for no BOOKMARKs: a quiet node resumes from its LIST's version, and once the "
        "server's history moves past it every watch is a 410 and a relist (10,000 agents: a LIST storm)"),
    Mutant(
        "agent.watch_timeout_fixed_short", "src/powerfleet/agent/podcache.py",
        "        return self._rng.randrange(WATCH_MIN_S, 2 * WATCH_MIN_S)",
        "        return 30",
        ("tests/agent/test_presence_watch.py",),
        "every agent resumes its watch every 30 s, all at once after a rollout: 10,000 agents cost the "
        "API server ~330 watches a second instead of ~22"),
    Mutant(
        "agent.client_without_keepalive", "src/powerfleet/cluster/keepalive.py",
        "    cfg.socket_options = keepalive_socket_options()",
        "    pass",
        ("tests/agent/test_build.py",),
        "the agent's API connections have no TCP keepalive: a half-open watch connection (a node or load "
        "balancer gone) leaves the pod view unchanged for the watch's whole 5-10 min instead of 60 s"),
    Mutant(
        "budget.pod_view_served_while_failing", "src/powerfleet/cluster/gpu_pod_cache.py",
        '            self._set_state("failing", why)',
        '            self._set_state("synced" if self._pods else "failing", why)',
        ("tests/cluster/test_gpu_pod_cache.py",),
        "a control process whose pod watch broke keeps serving its last view: the ledger misses every pod "
        "scheduled since, and a rack's allowance counts GPUs that are no longer free"),
    Mutant(
        "budget.pod_view_keeps_deleted_pods", "src/powerfleet/cluster/gpu_pod_cache.py",
        '                if change.type == "DELETED" or not self.keep(pod):',
        '                if not self.keep(pod):',
        ("tests/cluster/test_gpu_pod_cache.py",),
        "a deleted pod stays in the ledger's view: its GPUs are charged for ever and the rack's "
        "deployments are held below what the rack can give them"),
)
