"""Beat: the tick schedule (see workers.app.beat_schedule) and the record of ticks run."""
