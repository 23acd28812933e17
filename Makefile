# The two commands: `make dev` runs Quor, `make test` passes the tests. Both provision first.
PYTHON := .venv/bin/python
SHELL := /bin/bash
# Python keeps its bytecode caches (some machines set PYTHONDONTWRITEBYTECODE): every process
# `make test` starts would otherwise compile each module it imports, and pytest rewrite each
# test module and plugin, again (about half of a test process's start).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: dev test test-quick coverage compose-test provision venv lint format migrate sandbox-image lock screenshots

provision:
	tools/provision

venv:
	tools/provision --venv-only

# Development mode (DEBUG, development keys) for everything `make dev` runs; the
# proxy lets sandboxes reach the scripted demo model on the host's loopback.
dev: export QUOR_DEBUG = 1
dev: export QUOR_EGRESS_PRIVATE_ALLOWLIST ?= 127.0.0.1:8090
dev: provision
	$(PYTHON) manage.py migrate --noinput
	$(PYTHON) manage.py seed_demo
	$(PYTHON) tools/run-dev

# The whole suite, in two passes that both run (either failing fails the target): the tests
# that can share the machine, in TEST_WORKERS processes at once (pytest-xdist; a file's
# tests stay in one process, with its module fixtures), then the `serial` ones, which stop
# a service every process uses, alone. Each process has its own database, Redis database,
# ports and Docker objects (tests/environment.py). The slowest tests are listed at the end:
# where the next minutes of the suite are (docs/performance.md).
TEST_WORKERS ?= 4
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
define both_passes
	@status=0; \
	$(PYTHON) -m pytest $(PARALLEL) --durations=25 -m "not serial" $(1) || status=$$?; \
	$(PYTHON) -m pytest -m serial $(2) || status=$$?; \
	exit $$status
endef
test: provision
	$(call both_passes)

# The suite as `make test` runs it, measuring the line and branch coverage of Quor's code
# in the test processes (not in the processes they start: web, worker, proxies).
coverage: provision
	$(call both_passes,--cov --cov-report=,--cov --cov-append --cov-report=term:skip-covered)

# The quick loop: every test that runs in the test process alone (no Docker, no browser, no
# process of its own; not the `slow` one), in parallel. Docker is out of its reach, so a
# test that needs it without its `docker` mark fails here.
QUICK := not docker and not browser and not processes and not slow and not serial
test-quick: provision
	DOCKER_HOST=unix:///nonexistent/docker.sock $(PYTHON) -m pytest $(PARALLEL) -m "$(QUICK)"

# The pictures of the main pages in docs/screenshots: the browser tests (tests/ui), which
# write them when QUOR_SCREENSHOTS_DIR is set.
screenshots: provision
	QUOR_SCREENSHOTS_DIR=docs/screenshots $(PYTHON) -m pytest -q -p no:cacheprovider tests/ui

# Brings the Compose deployment (deploy/compose) up for real, runs a demo session, probes
# the sandbox's isolation, then takes it all down (tools/compose-check).
compose-test: provision
	tools/compose-check

# Needs only the virtualenv: no database, Redis or Docker (makemigrations' history check
# warns that it cannot reach the database; the check of the models does not need it).
lint: export QUOR_DEBUG = 1
lint: venv
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	$(PYTHON) -W "ignore:Got an error checking a consistent migration history:RuntimeWarning" \
		manage.py makemigrations --check --dry-run

format:
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

migrate: export QUOR_DEBUG = 1
migrate: provision
	$(PYTHON) manage.py migrate --noinput

# Builds the sandbox image (deploy/sandbox) again; Docker's cache keeps unchanged steps.
sandbox-image: provision
	tools/build-sandbox-image

# Regenerates requirements.lock from requirements.txt and requirements-dev.txt: every
# package, transitive ones too, pinned with the hashes of its files.
lock: venv
	.venv/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
		--no-emit-index-url --no-emit-find-links \
		--output-file requirements.lock requirements.txt requirements-dev.txt
