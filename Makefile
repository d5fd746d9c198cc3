PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint golden embed-demo bench clean

EXTRAS_VENV := .venv-extras
SEED_TEXT   ?= ../shared/seed/anisotropy-narrow-cone.txt

setup: $(STAMP) .jars/delta-spark_2.13-4.0.0.jar

$(STAMP): requirements.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

.jars/delta-spark_2.13-4.0.0.jar: tools/fetch_jars.py
	$(PY) tools/fetch_jars.py .jars

demo: setup
	$(PY) -m jobs.demo --conf conf/demo.yaml

test: setup
	$(PY) -m pytest -q tests

lint: setup
	$(VENV)/bin/ruff check anisotropy_core anisotropy_spark jobs bench tests tools
	$(VENV)/bin/ruff format --check anisotropy_core anisotropy_spark jobs bench tests tools
	$(VENV)/bin/mypy

# optional, needs torch (a multi-GB download): reference IsoScores for the tests, and the demo corpus
$(EXTRAS_VENV)/.installed: requirements-extras.txt
	$(PYTHON) -m venv $(EXTRAS_VENV)
	$(EXTRAS_VENV)/bin/pip install --quiet -r requirements-extras.txt
	touch $@

golden: $(EXTRAS_VENV)/.installed
	$(EXTRAS_VENV)/bin/python tools/make_golden.py tests/fixtures/isoscore_golden.json

embed-demo: $(EXTRAS_VENV)/.installed
	HF_HUB_OFFLINE=1 $(EXTRAS_VENV)/bin/python tools/embed_demo.py $(SEED_TEXT) data

bench: setup
	$(PY) -m bench.diagnose
	$(PY) -m bench.apply
	$(PY) -m bench.kmeans

clean:
	rm -rf out spark-warehouse metastore_db derby.log
