# Two commands for a fresh machine (Python 3.10+ with venv):
#   make demo   set up .venv, train a small model on a real corpus, sample from it
#   make test   set up .venv, run the test suite and build the docs strictly
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.specformer-installed

.PHONY: demo test test-slow docs bench clean

$(STAMP): pyproject.toml tests/fixtures/toy_plugin/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools
	# The CPU build of torch: an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[train,test,docs]'
	# A third-party plugin package, installed the way a user would install one.
	$(PY) -m pip install -q --no-deps --no-build-isolation -e tests/fixtures/toy_plugin
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specformer train specs/tiny.yaml

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider; status=$$?; [ $$status -eq 0 ] || [ $$status -eq 5 ] || exit $$status
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow; status=$$?; [ $$status -eq 0 ] || [ $$status -eq 5 ] || exit $$status

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

bench: $(STAMP)
	$(PY) benchmarks/bench_overhead.py

clean:
	rm -rf $(VENV) site artifacts runs .pytest_cache
