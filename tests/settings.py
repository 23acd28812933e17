"""The settings of the tests: Quor's own (quor/settings.py), read from the environment of
this test process, which tests/environment.py gives each pytest-xdist worker apart.

pytest loads this module with `--ds` (pyproject.toml), which wins over the environment;
the processes the tests start inherit the environment and load quor.settings, with any
change a test makes to it."""

import os

from tests.environment import ENVIRONMENT

os.environ.update(ENVIRONMENT)
os.environ["DJANGO_SETTINGS_MODULE"] = "quor.settings"

from quor.settings import *  # noqa: F403
