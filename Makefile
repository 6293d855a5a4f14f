# Two commands for a fresh machine (Python 3.10+ with venv):
#   make demo   set up .venv, train a small model on a real corpus, sample from it
#   make test   set up .venv, run the test suite (it includes the strict docs build)
# specformer is installed into .venv, not onto your PATH: `. .venv/bin/activate` first.
VENV ?= .venv
PY := $(VENV)/bin/python
# Quiet pip: no progress bars, no "new release of pip" notice; warnings and errors still show.
PIP := $(PY) -m pip --quiet --disable-pip-version-check --no-input
STAMP := $(VENV)/.specformer-installed
# The default suite runs in two processes (pytest-xdist), one core each: most tests are tiny models, whose time is
# Python's, on one core. `make test TEST_WORKERS=auto` uses every core. The slow suite runs in two processes too:
# its multi-process training tests start workers of their own and then share the cores for a while, which only
# slows them, and the rest of it (compiled models, convergence, the parity variants) halves its time.
TEST_WORKERS ?= 2

.PHONY: demo test test-kernels test-slow docs docs-refresh bench mutation clean

# The set-up, once (a changed pyproject.toml redoes it). Notes on the steps:
# - torch is pinned to its CPU build: an unpinned torch would pull a multi-GB CUDA build.
# - setuptools notes that an editable install of packages from two folders (core/, plugins/)
#   uses an import hook; that is expected here, so the note is silenced.
# - older versions installed the tests' plugins into .venv, where they showed up in every
#   catalogue; the tests now stage them themselves, so they are removed if present.
$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (once): PyTorch's CPU build, then specformer with its train, eval, test and docs extras"
	@python3 -m venv $(VENV)
	@$(PIP) install --upgrade pip setuptools
	@$(PIP) install torch==2.13.0
	@PYTHONWARNINGS="ignore:Editable installation" $(PIP) install -e '.[train,eval,test,docs]'
	@$(PIP) uninstall --yes specformer-toy specformer-tutorial 2>/dev/null || true
	@touch $(STAMP)

# The demo starts afresh each time: --overwrite replaces the previous demo's runs/tiny (a plain
# `specformer train` refuses to touch an earlier run's checkpoints).
demo: $(STAMP)
	$(VENV)/bin/specformer train specs/tiny.yaml --overwrite
	@echo "specformer is in $(VENV): '. $(VENV)/bin/activate' puts it on your PATH (or run $(VENV)/bin/specformer)"

# The suite builds the docs with `mkdocs build --strict` itself (tests/docs), so it is not built twice.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup; status=$$?; [ $$status -eq 0 ] || [ $$status -eq 5 ] || exit $$status

# The default suite again on PyTorch's `default` CPU kernels. PyTorch picks its SIMD kernels (AVX2,
# AVX-512, ...) by CPU, and float32 sums round differently in each, so a test that passes only
# on this CPU's kernels fails here, not on a user's machine (docs/testing.md). `default` is the
# lowest capability, the one every CPU has, x86 or ARM. It compiles into an Inductor cache of its
# own (tests/conftest.py): PyTorch reads back a kernel compiled under another capability.
test-kernels: $(STAMP)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup; status=$$?; [ $$status -eq 0 ] || [ $$status -eq 5 ] || exit $$status

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow -n $(TEST_WORKERS) --dist loadgroup; status=$$?; [ $$status -eq 0 ] || [ $$status -eq 5 ] || exit $$status

docs: $(STAMP)
	$(VENV)/bin/mkdocs serve

# Command output and included files are kept in the docs pages themselves (so they read the same in an
# editor and on the repository page); this regenerates them. The test suite fails while any is stale.
docs-refresh: $(STAMP)
	$(PY) docs/_hooks/refresh_docs.py

bench: $(STAMP)
	$(PY) benchmarks/bench_overhead.py

# Mutation testing (docs/testing.md), never part of `make test`: plants small bugs in the modules
# listed in tools/mutation.py and reports the ones the tests miss. Pick modules and bounds with
#   make mutation MUTATION_ARGS="--modules plugins/specformer_train/schedule.py --max-mutants 60"
mutation: $(STAMP)
	@$(PY) -c "import mutmut" 2>/dev/null || $(PIP) install -e '.[mutation]'
	$(PY) tools/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) site artifacts runs .pytest_cache
