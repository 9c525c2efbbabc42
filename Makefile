# Two set-up commands: `make demo` (main job) and `make test` (whole suite).
# `make test-loaded`: the suite beside a CPU hog (HOG_PER_CPU busy processes per CPU, killed
# after; tests/cpu_hog.py), as on a busy machine; TESTS= narrows it (default: the whole suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

HOG_PER_CPU ?= 3
TESTS ?= tests

.PHONY: demo test test-loaded venv clean bench bench-long

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[test,bench,docs]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/hil demo

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

test-loaded: $(STAMP)
	$(BIN)/python tests/cpu_hog.py --per-cpu $(HOG_PER_CPU) -- $(BIN)/python -m pytest -q $(TESTS)

bench: $(STAMP)
	$(BIN)/python benchmarks/loop_jitter.py
	$(BIN)/python benchmarks/plant_speed.py
	$(BIN)/python benchmarks/gap_cost.py
	$(BIN)/python benchmarks/bus_latency.py
	$(BIN)/python benchmarks/protocol_latency.py
	$(BIN)/python benchmarks/grid_speed.py
	$(BIN)/python benchmarks/manipulator_speed.py
	$(BIN)/python benchmarks/panda_loop.py --wall 10
	$(BIN)/python benchmarks/gym_speed.py
	$(BIN)/python benchmarks/campaign_throughput.py

bench-long: bench
	$(BIN)/python benchmarks/sysid_speed.py

clean:
	rm -rf $(VENV) runs
