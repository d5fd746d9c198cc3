PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test clean

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

clean:
	rm -rf out spark-warehouse metastore_db derby.log
