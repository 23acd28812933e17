# The two commands: `make dev` runs Quor, `make test` passes the tests. Both provision first.
PYTHON := .venv/bin/python
SHELL := /bin/bash

.PHONY: dev test provision lint format migrate sandbox-image

provision:
	tools/provision

# Development mode (DEBUG, development keys) for everything `make dev` runs.
dev: export QUOR_DEBUG = 1
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
