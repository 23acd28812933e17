# The two commands: `make dev` runs Quor, `make test` passes the tests. Both provision first.
PYTHON := .venv/bin/python
SHELL := /bin/bash

.PHONY: dev test provision lint format migrate sandbox-image

provision:
	tools/provision

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

lint: provision
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports

format:
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

migrate: export QUOR_DEBUG = 1
migrate: provision
	$(PYTHON) manage.py migrate --noinput
