# One command each: `make render` sets up and draws OPT-125M's dtype flow; `make test` sets up
# and runs the tests. Both create .venv on first use and reuse it after.
PYTHON ?= python3
VENV ?= .venv
# The CUDA build of torch lets fake CUDA tensors run the real CUDA autocast kernels without a GPU.
TORCH_SPEC ?= torch==2.14.1
# Vision models nobody here wrote, for the fidelity tests: torchvision must match torch (0.29.1 is
# 2.14.1's). With another torch they are left out and those tests skip.
VISION_SPEC ?= $(if $(filter torch==2.14.1,$(TORCH_SPEC)),torchvision==0.29.1 timm,)
BIN := $(VENV)/bin

.PHONY: setup graphviz chromium render docs test test-hffx check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(if $(VISION_SPEC),$(BIN)/pip install --quiet "$(TORCH_SPEC)" $(VISION_SPEC))
	$(BIN)/pip install --quiet -e ".[test,docs]"
	touch $@

# Graphviz's dot lays the diagrams out. Installed from Debian's packages when we are root.
graphviz:
	@command -v dot >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && apt-get install -y -qq graphviz >/dev/null; \
	  else \
	    echo "Graphviz's dot is missing: install it (apt-get install graphviz / brew install graphviz)" >&2; \
	  fi; }

# Headless Chromium opens the built documentation in the tests (light and dark mode).
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "Chromium is missing: install it (apt-get install chromium) for the docs tests" >&2; \
	  fi; }

# The documentation site, warnings as errors; figures are drawn by ampgraph's Sphinx directive
# (cached: a rebuild takes seconds). Open docs/_build/html/index.html.
docs: setup graphviz
	$(BIN)/sphinx-build -j auto -W --keep-going -b html docs docs/_build/html

render: setup graphviz
	$(BIN)/ampgraph render

check: setup
	$(BIN)/ampgraph check

# The documentation site, then the main suite (which opens the site in Chromium), then the hf-fx
# tracer's tests in a side environment with transformers 4.45.2 (the last line that has
# transformers.utils.fx), laid over .venv's torch.
test: setup graphviz chromium docs
	AMPGRAPH_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -q
	VENV=$(VENV) scripts/hf_fx_env.sh

test-hffx: setup
	VENV=$(VENV) scripts/hf_fx_env.sh

clean:
	rm -rf $(VENV) .venv-hf45 ampgraph-out .pytest_cache docs/_build docs/_generated
