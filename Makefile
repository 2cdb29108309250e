# One command each: `make render` sets up and draws OPT-125M's dtype flow; `make test` sets up
# and runs the tests. Both create .venv on first use and reuse it after.
PYTHON ?= python3
VENV ?= .venv
# The CUDA build of torch lets fake CUDA tensors run the real CUDA autocast kernels without a GPU.
# Any supported release works (ampgraph/compat.py, docs/support-matrix.md): `make test
# TORCH_SPEC=torch==2.11.0` builds .venv with it, and rebuilds .venv when the spec changes.
TORCH_SPEC ?= torch==2.14.1
# Vision models nobody here wrote, for the fidelity tests: torchvision must match torch. torch 2.N
# pairs with torchvision 0.(N+15) (0.29.1 is 2.14.1's); for a torch spec not of the form
# torch==2.N.x they are left out and those tests skip.
_TORCH_MINOR = $(word 2,$(subst ., ,$(patsubst torch==%,%,$(1))))
_VISION_MINOR = $(word $(call _TORCH_MINOR,$(1)),x x x x x x x x 24 25 26 27 28 29)
VISION_SPEC ?= $(if $(filter torch==2.14.1,$(TORCH_SPEC)),torchvision==0.29.1 timm,$(if \
  $(filter torch==2.%,$(TORCH_SPEC)),$(if $(filter-out x,$(call _VISION_MINOR,$(TORCH_SPEC))),\
  torchvision==0.$(call _VISION_MINOR,$(TORCH_SPEC)).* timm,),))
BIN := $(VENV)/bin
# The floor: the oldest torch ampgraph supports, in a second venv where `make test` runs the quick
# slice below after the main suite (`make test-floor` alone). Which slice, and why it is enough:
# docs/support-matrix.md.
FLOOR_TORCH_SPEC ?= torch==2.9.1
FLOOR_TRANSFORMERS_SPEC ?= transformers==5.24.0
FLOOR_VISION_SPEC ?= torchvision==0.24.1
FLOOR_VENV ?= .venv-floor
FLOOR_TESTS ?= tests/test_compat.py src/ampgraph/compat.py tests/test_compat_fake_cuda.py \
  src/ampgraph/capture/driverless_29.py src/ampgraph/capture/elf_symbols.py tests/test_policy.py \
  tests/test_capture_engines.py tests/test_tracers.py tests/test_meta_kernels.py \
  tests/test_autocast_kernels.py tests/test_single_ops.py tests/test_seed_notebook.py \
  tests/test_verify.py tests/test_cli.py
# The training pass in a pytest process of its own: on torch 2.10, a process that has run a
# backward cannot use autograd in the workers it forks after (torch refuses, "Unable to handle
# autograd's threading in combination with fork-based multiprocessing", or the worker hangs);
# the two tests that run the command line in-process after this module's backwards are left out
# there. A command started on its own (the support matrix's train column) is not affected.
FLOOR_TRAIN_TESTS ?= tests/test_backward.py \
  --deselect tests/test_backward.py::test_cli_table_markdown_for_the_training_step \
  --deselect tests/test_backward.py::test_cli_check_and_table_for_the_backward

.PHONY: setup graphviz chromium render docs test test-hffx test-floor check clean FORCE

setup: $(VENV)/.installed

# What .venv was built with: a change of TORCH_SPEC or VISION_SPEC rebuilds it. An existing .venv
# without the record is taken as built from the specs given now.
$(VENV)/.specs: FORCE
	@mkdir -p $(VENV)
	@if [ ! -f $@ ] && [ -f $(VENV)/.installed ]; then \
	  echo '$(TORCH_SPEC) $(VISION_SPEC)' > $@; touch -r $(VENV)/.installed $@; \
	elif ! echo '$(TORCH_SPEC) $(VISION_SPEC)' | cmp -s - $@; then \
	  echo '$(TORCH_SPEC) $(VISION_SPEC)' > $@; fi

$(VENV)/.installed: pyproject.toml $(VENV)/.specs
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(if $(VISION_SPEC),$(BIN)/pip install --quiet "$(TORCH_SPEC)" $(VISION_SPEC))
	$(BIN)/pip install --quiet -e ".[test,docs,fp8]" "$(TORCH_SPEC)"
	touch $@

$(FLOOR_VENV)/.installed: pyproject.toml
	rm -rf $(FLOOR_VENV)
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/pip install --quiet --upgrade pip
	$(FLOOR_VENV)/bin/pip install --quiet "$(FLOOR_TORCH_SPEC)" "$(FLOOR_VISION_SPEC)"
	$(FLOOR_VENV)/bin/pip install --quiet -e ".[test]" "$(FLOOR_TORCH_SPEC)" "$(FLOOR_VISION_SPEC)" \
	  "$(FLOOR_TRANSFORMERS_SPEC)"
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
	$(MAKE) test-floor

test-hffx: setup
	VENV=$(VENV) scripts/hf_fx_env.sh

# The quick slice on the floor torch (FLOOR_TORCH_SPEC), in its own venv.
test-floor: $(FLOOR_VENV)/.installed graphviz
	$(FLOOR_VENV)/bin/python -m pytest -q -p no:cacheprovider $(FLOOR_TESTS)
	$(FLOOR_VENV)/bin/python -m pytest -q -p no:cacheprovider $(FLOOR_TRAIN_TESTS)

clean:
	rm -rf $(VENV) $(FLOOR_VENV) .venv-hf45 ampgraph-out .pytest_cache docs/_build docs/_generated
