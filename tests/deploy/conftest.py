"""Rendering the Helm chart with the real `helm` binary (installed by tools/provision
through tools/install-helm), once per value set and Kubernetes version."""

import os
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "quor"
HELM = REPO / ".tools" / "bin" / "helm"
RELEASE = "quor"
NAMESPACE = "quor"


class Helm:
    def __init__(self, home: Path):
        self.env = {
            **os.environ,
            # helm keeps caches and configuration under these: keep them out of $HOME.
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        self.values_dir = home / "values"
        self.values_dir.mkdir()
        self._rendered: dict[tuple[str, str], list[dict]] = {}

    def run(self, *args: str, values: dict | None = None) -> subprocess.CompletedProcess:
        argv = [str(HELM), *args]
        if values:
            path = self.values_dir / f"values-{len(list(self.values_dir.iterdir()))}.yaml"
            path.write_text(yaml.safe_dump(values))
            argv += ["--values", str(path)]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)

    def template(self, values: dict | None, kube_version: str) -> subprocess.CompletedProcess:
        return self.run(
            "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--kube-version", kube_version, values=values,
        )  # fmt: skip

    def render(self, name: str, values: dict | None, kube_version: str) -> list[dict]:
        """The chart's objects for one named value set; rendered once per test session."""
        key = (name, kube_version)
        if key not in self._rendered:
            result = self.template(values, kube_version)
            assert result.returncode == 0, result.stderr
            self._rendered[key] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
        return self._rendered[key]


@pytest.fixture(scope="session")
def helm(tmp_path_factory) -> Helm:
    if not os.access(HELM, os.X_OK):
        pytest.fail(f"{HELM} is missing: run tools/provision (it calls tools/install-helm)")
    return Helm(tmp_path_factory.mktemp("helm"))
