"""The settings of the tests: Quor's own (quor/settings.py), read from the environment of
this test process, which tests/environment.py gives each pytest-xdist worker apart.

pytest loads this module with `--ds` (pyproject.toml), which wins over the environment;
the processes the tests start inherit the environment and load quor.settings, with any
change a test makes to it."""

import os

from django.contrib.auth.hashers import PBKDF2PasswordHasher

from tests.environment import ENVIRONMENT

os.environ.update(ENVIRONMENT)
os.environ["DJANGO_SETTINGS_MODULE"] = "quor.settings"

from quor.settings import *  # noqa: F403


class FewIterationsPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Quor's hasher (PBKDF2-SHA256) with few iterations, for the passwords the tests
    make: a hash keeps its iteration count, so Quor's processes check it as quickly, and
    the hundreds of wrong passwords the login and link tests try cost nothing (a million
    iterations take PBKDF2 about 0.4 s of CPU each)."""

    iterations = 1000


PASSWORD_HASHERS = ["tests.settings.FewIterationsPBKDF2PasswordHasher"]

# WhiteNoise looks a static file up when it is asked for, instead of listing every static
# file when its middleware is made: Django's test client makes the middleware anew for
# each client, and the listing took 50 ms each time (11 s of CPU in the quick loop).
WHITENOISE_AUTOREFRESH = True
