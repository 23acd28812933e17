# The two commands: `make dev` runs Quor, `make test` passes the tests. Both provision first.
PYTHON := .venv/bin/python
SHELL := /bin/bash

.PHONY: dev test compose-test provision venv lint format migrate sandbox-image lock screenshots

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

test: provision
	$(PYTHON) -m pytest

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
