# One command each: `make demo` (set up a fresh machine, run the built-in workload) and
# `make test` (set up, then lint with ruff and run the whole suite). Python 3.9+ and a C
# compiler-free machine suffice.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: setup demo test browser bench clean

setup: $(VENV)/.installed

# The CPU build of torch is pinned for development and CI (constraints-cpu.txt), so setup
# never pulls a multi-GB CUDA build. On a GPU machine, install into your own environment.
$(VENV)/.installed: pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints-cpu.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints-cpu.txt -e '.[test]'
	touch $@

demo: setup
	$(BIN)/ddp-profile demo

# The browser test drives Debian's chromium (never a downloaded browser).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q chromium; }

# The suite in two passes: the tests that assert no measured rate, or one that holds beside
# another test, two at a time (one fills the CPUs another leaves idle in sleeps and start-ups),
# the longest first (tests/conftest.py), then every other test alone.
# The package is compiled once first: where PYTHONDONTWRITEBYTECODE is set (CI images often
# set it) every rank of every probe would otherwise compile it again on import. pytest runs
# with it unset, so that its rewritten test modules are written once and read by each later
# collection (each worker's and the second pass's) instead of rewritten every time.
test: setup browser
	$(BIN)/ruff check ddp_profile tests benchmarks docs
	$(BIN)/python -m compileall -q ddp_profile tests
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -m concurrent -n 2 --durations=10
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -m "not concurrent" --durations=15

# The peers install beside the pinned CPU torch. Only loadtune requires torch (traceml-ai,
# gpuprof and datapath-doctor name it in optional extras only); the constraints file holds it
# to the installed build, and the check after the install fails loudly should anything have
# replaced it. If it ever does, install loadtune alone with --no-deps and its other
# requirements: jinja2>=3.1 matplotlib>=3.7 numpy>=1.24 psutil.
bench: setup
	$(BIN)/pip install -q -c constraints-cpu.txt -e '.[bench]'
	$(BIN)/python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') \
		else 'the bench extra replaced torch: ' + torch.__version__)"
	$(BIN)/python benchmarks/overhead.py --quick
	$(BIN)/python benchmarks/peers.py --quick

clean:
	rm -rf $(VENV) build *.egg-info
