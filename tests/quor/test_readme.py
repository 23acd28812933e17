"""Every setting read from the environment has a row in the README's table."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_environment_setting_is_documented_in_the_readme():
    settings_source = (ROOT / "quor/settings.py").read_text()
    names = set(re.findall(r'env(?:bool|int|list)?\("([A-Z_]+)"', settings_source))
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"`([A-Z][A-Z_]+)`", readme))
    assert len(names) > 20
    assert names - documented == set()
