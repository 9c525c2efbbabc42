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
	$(BIN)/pip install -q "torch==2.13.0"  # CPU build for the rl extra (see pyproject.toml)
	$(BIN)/pip install -q -e ".[test,bench,docs,rl,dashboard,iec104]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/hil demo

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=30 tests

test-loaded: $(STAMP)
	$(BIN)/python tests/cpu_hog.py --per-cpu $(HOG_PER_CPU) -- $(BIN)/python -m pytest -q $(TESTS)

# Every benchmark's JSON goes through benchmarks/results.py: benchmarks/results/<name>.json
# (date, machine, load, versions, commit) and the generated table benchmarks/results/README.md,
# which the docs' Benchmarks page shows. Figures in README/docs come only from there.
RECORD = $(BIN)/python benchmarks/results.py record

bench: $(STAMP)
	$(RECORD) loop_jitter -- $(BIN)/python benchmarks/loop_jitter.py
	$(RECORD) loop_jitter_10k -- $(BIN)/python benchmarks/loop_jitter.py --rate 10000 --duration 10
	$(RECORD) loop_jitter_20k -- $(BIN)/python benchmarks/loop_jitter.py --rate 20000 --duration 10
	$(RECORD) plant_speed -- $(BIN)/python benchmarks/plant_speed.py
	$(RECORD) gap_cost -- $(BIN)/python benchmarks/gap_cost.py
	$(RECORD) loop_overhead -- $(BIN)/python benchmarks/loop_overhead.py
	$(RECORD) bus_latency -- $(BIN)/python benchmarks/bus_latency.py
	$(RECORD) protocol_latency -- $(BIN)/python benchmarks/protocol_latency.py
	$(RECORD) grid_speed -- $(BIN)/python benchmarks/grid_speed.py
	$(RECORD) grid_series -- $(BIN)/python benchmarks/grid_series.py
	$(RECORD) manipulator_speed -- $(BIN)/python benchmarks/manipulator_speed.py
	$(RECORD) shield -- $(BIN)/python benchmarks/shield.py
	$(RECORD) panda_loop -- $(BIN)/python benchmarks/panda_loop.py --wall 10
	$(RECORD) gym_speed -- $(BIN)/python benchmarks/gym_speed.py

bench-long: bench
	$(RECORD) sysid_speed -- $(BIN)/python benchmarks/sysid_speed.py
	$(RECORD) campaign_throughput -- $(BIN)/python benchmarks/campaign_throughput.py

clean:
	rm -rf $(VENV) runs
