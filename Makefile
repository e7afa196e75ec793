# Convenience targets; the README's test command is `python -m pytest`.
PYTHON ?= python3
VENV ?= .venv

.PHONY: demo test lint install clean

install:
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet '.[test]'

demo: install
	PYTHON=$(VENV)/bin/python scripts/demo.sh

test: install
	$(VENV)/bin/python -m pytest

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build/demo
