# Kestrel top-level entry points. `make demo` and `make test` install missing
# Debian packages, configure, build and run; everything else is CMake.
PRESET ?= dev
BUILD := build/$(PRESET)
JOBS ?= 2

FUZZ_SECONDS ?= 600

.PHONY: all deps configure build test demo bench fuzz clean

all: build

deps:
	@bash scripts/install_deps.sh

configure: deps
	@cmake --preset $(PRESET) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@bash scripts/run_tests.sh $(BUILD)

# The demo is timed (10 minutes of RL), so it runs the optimised build.
demo: deps
	@cmake --preset release >/dev/null && cmake --build build/release -j $(JOBS) --target kestrel
	@build/release/kestrel train

bench: deps
	@cmake --preset release >/dev/null && cmake --build build/release -j $(JOBS)

# libFuzzer targets (fuzz/, docs/reliability.md): each runs FUZZ_SECONDS over
# its committed seeds; new inputs go to build/fuzz/corpus/<target>, crashes
# to build/fuzz/artifacts/. FUZZ_TARGETS narrows the list (names as in fuzz/corpus).
fuzz: deps
	@bash scripts/run_fuzz.sh $(FUZZ_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf build
