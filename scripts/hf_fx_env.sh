#!/usr/bin/env bash
# The hf-fx tracer's CI side environment: transformers 4.45.2 (the last release line whose
# transformers.utils.fx traces with current torch; 4.50 removed it) laid over .venv's torch with
# PYTHONPATH, so there is no second torch to download (DESIGN.md fact 10; ~113 MB, ~20 s from a
# warm pip cache). Then the hf-fx tests run there; extra arguments go to pytest.
#
#   scripts/hf_fx_env.sh              # create .venv-hf45 once, run `pytest -m hffx`
#   scripts/hf_fx_env.sh -x -v        # same, with pytest options
#   HF45=/tmp/hf45 scripts/hf_fx_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
HF45=${HF45:-.venv-hf45}

if [ ! -x "$VENV/bin/python" ]; then
  echo "no $VENV: run 'make setup' first" >&2
  exit 2
fi
if [ ! -f "$HF45/.installed" ]; then
  rm -rf "$HF45"
  # --no-deps: torch, numpy, safetensors, ... come from .venv; only what 4.45 needs on top.
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --target "$HF45" --no-deps \
    transformers==4.45.2 'tokenizers>=0.20,<0.21' 'huggingface-hub>=0.23,<1.0' \
    requests urllib3 idna charset-normalizer certifi
  touch "$HF45/.installed"
fi
# A skip of the hffx tests here would hide a broken overlay: make it a failure.
export AMPGRAPH_REQUIRE_HF_FX=1
export PYTHONPATH="$PWD/$HF45${PYTHONPATH:+:$PYTHONPATH}"
"$VENV/bin/python" -c 'import transformers.utils.fx as fx, transformers as t; print(f"transformers {t.__version__} from {t.__file__}")'
exec "$VENV/bin/python" -m pytest -q -m hffx "$@"
