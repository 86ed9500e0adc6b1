"""The app that `celery -A powerfleet.workers.entry` and the powerfleet CLI load.

Config comes from POWERFLEET_CONFIG and POWERFLEET_* variables; a parent process
(`powerfleet up`) passes the embedded broker's URL as POWERFLEET_BROKER__URL.
"""

from powerfleet.config import load_config
from powerfleet.workers.app import create_app

app = create_app(load_config())
