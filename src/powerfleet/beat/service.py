"""Beat's process: Celery's, with a stop that never lands inside a pass (see beat/scheduler.py)."""

from __future__ import annotations

from types import FrameType

from celery import beat as celery_beat
from celery import platforms
from celery.apps.beat import Beat

from powerfleet.beat.scheduler import FleetScheduler


class FleetBeat(Beat):
    def install_sync_handler(self, service: celery_beat.Service) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            # The scheduler is a lazy attribute: read it without building it from a signal handler.
            scheduler = service.__dict__.get("scheduler")
            if isinstance(scheduler, FleetScheduler) and not scheduler.request_stop():
                return  # mid-pass: the pass finishes its publish, then raises SystemExit itself
            service.sync()
            raise SystemExit()

        platforms.signals.update(SIGTERM=stop, SIGINT=stop)
