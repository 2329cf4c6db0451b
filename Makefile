# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Both create .venv on first use; later runs reuse it (the stamp changes only with pyproject.toml).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: demo test test-fast lint docs venv clean

venv: $(STAMP)

$(STAMP):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "lucidrl needs Python >= 3.10; set PYTHON=python3.11")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[test]"
	@rm -f $(VENV)/.installed-*
	@touch $@
	@echo "environment ready: $(VENV)"

demo: $(STAMP)
	$(VENV)/bin/lucidrl demo

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# ruff, and the layer map of docs/architecture.md (import-linter's contracts in pyproject.toml)
lint: $(STAMP)
	$(VENV)/bin/ruff check lucidrl tests benchmarks
	$(VENV)/bin/ruff format --check lucidrl tests benchmarks
	$(VENV)/bin/lint-imports --no-cache

# the manual: docs/ built with MkDocs (Material), strictly (a broken link or page fails); the
# configuration reference is regenerated from the schema first
docs: $(STAMP)
	$(PY) -m lucidrl.config.reference docs/reference/configuration.md
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d site
	@echo "docs built: site/index.html"

clean:
	rm -rf $(VENV) outputs runs site .pytest_cache
