# moetrain — build, test, run. `make help` lists the targets.
#
#   make            build/moetrain (CUDA backend included when nvcc is found; SM=90a default)
#   make run        deps if missing, build, train L0_sanity with mpirun -np 2 (EP=2), plot it
#   make test       the CPU test suite (what CI runs); ends with "N passed, N failed"
#   make test-gpu   the GPU tests (needs a GPU; PREBUILT=1: run what is in build/, build nothing)
#   make gpu-tests  build the GPU tests without running them (CI does, so they keep compiling)
#   make dev        build dev/: experiments and timings, never linked into moetrain (dev/README.md)
#   make bench      the benchmark against Hugging Face (needs a GPU, torch, transformers; PREBUILT=1 as above)
#   make fuzz       the fuzz targets, FUZZ_SECONDS each
#   make bench-crc  checksum throughput on this CPU (zlib crc32 vs CRC-32C; FILES=... also times reading them)
#   make install    PREFIX=/usr/local: bin/moetrain + share/moetrain/{configs,data,scripts}
#   make deps       install missing Debian/Ubuntu packages (Open MPI, libyaml, zlib, SentencePiece, matplotlib)
#   make clean      remove build/

PREFIX ?= /usr/local
SM ?= 90a
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
CUDA ?= $(shell test -x $(NVCC) && test -f cuda/cuda_backend.cu && echo 1 || echo 0)
NP ?= 2
FUZZ_SECONDS ?= 60
VERSION := 0.1.0

BUILD := build
CC := mpicc
CFLAGS ?= -O2 -g
CFLAGS += -std=c11 -fopenmp -Wall -Wextra -Wno-unused-parameter -MMD -MP -Isrc \
          -DMOETRAIN_VERSION='"$(VERSION)"' -DMOETRAIN_PREFIX='"$(PREFIX)"'
LIBYAML_A := $(firstword $(wildcard /usr/lib/x86_64-linux-gnu/libyaml.a /usr/lib/aarch64-linux-gnu/libyaml.a /usr/lib/libyaml.a /usr/local/lib/libyaml.a))
LDLIBS := -Wl,-Bstatic -lyaml -Wl,-Bdynamic -lz -lm -fopenmp
# the CUDA source run on the CPU (tests/host_cuda) links no CUDA library; MPI for the CPU backend
HOST_LDLIBS := $(LDLIBS) $(shell $(CC) --showme:link 2>/dev/null)

# sm_90a needs the -gencode form (see docs/gpu.md); other targets use plain arch/code pairs.
GENCODE := -gencode=arch=compute_$(SM),code=sm_$(SM)
NVFLAGS := -O3 -std=c++17 -Isrc -Icuda $(GENCODE) -Xcompiler -fPIC -lineinfo \
           --expt-relaxed-constexpr -MMD -MP
# the wgmma attention kernels are built only for sm_90a (cuda/wgmma.cuh)
ifeq ($(SM),90a)
  NVFLAGS += -DMOETRAIN_SM90A=1
endif

SRC := $(wildcard src/*.c src/cpu/*.c)
CMD := $(wildcard cmd/*.c)
CU := $(wildcard cuda/*.cu)  # the product's kernels only: experiments live in dev/ (`make dev`)
OBJ := $(SRC:%.c=$(BUILD)/%.o)
ifeq ($(CUDA),1)
  OBJ += $(CU:%.cu=$(BUILD)/%.o)
  # until cuda/comm_nccl.cu exists, a stub comm_nccl_create (returns NULL) keeps the link whole
  OBJ += $(if $(wildcard cuda/comm_nccl.cu),,$(BUILD)/cuda/stub/nonccl.o)
  CFLAGS += -DMOETRAIN_CUDA=1 -I$(CUDA_HOME)/include
  LDLIBS += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib64/stubs -lcublasLt -lnccl -lcudart_static -ldl -lrt -lpthread -lstdc++
else
  OBJ += $(BUILD)/cuda/stub/nocuda.o
endif
LIB := $(BUILD)/libmoetrain.a
# PREBUILT=1: `make test-gpu` and `make bench` run the binaries already in $(BUILD) and build
# nothing (built on another machine and copied in: a GPU machine without the build dependencies).
# Default: 1 when $(BUILD)/moetrain is there without $(BUILD)/libmoetrain.a (binaries alone), else 0.
PREBUILT ?= $(if $(and $(wildcard $(BUILD)/moetrain),$(if $(wildcard $(LIB)),,1)),1,0)

# The user's scripts beside the binary (make install): tokenizing data, plotting metrics, mpirun with signals forwarded.
USER_SCRIPTS := $(wildcard scripts/tokenize_data.py scripts/plot.py scripts/mpirun.sh)
TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c tests/mpi_*.c))
# CUDA source run on the CPU (tests/host_cuda: stand-ins for CUDA's headers, kernels as host threads;
# C++20): tests/*_host.cc, and the GPU tests whose ops it compiles, in `make test`
TESTS += $(patsubst tests/%.cc,$(BUILD)/tests/%,$(wildcard tests/test_*_host.cc))
HOST_OBJ := $(patsubst %,$(BUILD)/host_cuda/%.o,cuda_fp8 cuda_fp8_lt cuda_fp8_kernels cuda_fp8_quant cuda_moe cuda_optim \
            cuda_rope cuda_loss cuda_router cuda_norm cublaslt_host backend_host host_pool)
HOST_CXX := $(CXX) -std=c++20 -O1 -g -ffp-contract=off -fsanitize=address,undefined -fno-sanitize-recover=all -Wall \
            -Wextra -Wno-unused-parameter -Wno-unused-function -Wno-unknown-pragmas \
            -Wno-deprecated-enum-enum-conversion -pthread -Itests/host_cuda -Isrc -Icuda
HOST_DEPS := $(wildcard tests/host_cuda/*.h tests/host_cuda/cub/device/*.cuh cuda/*.cuh) src/backend.h src/fp8.h
.SECONDARY: $(HOST_OBJ)
# GPU tests whose ops the stand-in compiles, built against it and run on the CPU as they are
HOST_GPU_TESTS := $(patsubst %,$(BUILD)/host_tests/%_host,test_cuda_fp8_quant test_cuda_moe test_cuda_optim \
                  test_cuda_rope test_cuda_loss test_cuda_router test_cuda_norm)
TESTS += $(HOST_GPU_TESTS)
GPU_TESTS := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/*.c))
DEV_OBJ := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard dev/cuda/*.cu))
DEV_LIB := $(BUILD)/libmoetrain_dev.a
DEV := $(patsubst dev/%.c,$(BUILD)/dev/%,$(wildcard dev/*.c)) $(BUILD)/dev/racecheck_probe
FUZZ := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))

.PHONY: all run test test-gpu gpu-tests dev bench bench-crc fuzz install deps clean help check-deps
all: $(BUILD)/moetrain

help:
	@sed -n '3,14p' Makefile | sed 's/^# //'

# ---- dependencies ----------------------------------------------------------------------------
deps:
	@scripts/deps.sh

check-deps:
	@scripts/deps.sh --check || scripts/deps.sh

# ---- build -----------------------------------------------------------------------------------
$(BUILD)/%.o: %.c | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu | check-deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/moetrain: $(CMD:%.c=$(BUILD)/%.o) $(LIB)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(LIB) tests/test.h | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(LIB) $(LDLIBS)
$(BUILD)/host_cuda/%.o: cuda/%.cu $(HOST_DEPS) | check-deps
	@mkdir -p $(dir $@)
	$(HOST_CXX) -x c++ -c $< -o $@
$(BUILD)/host_cuda/%.o: tests/host_cuda/%.cc $(HOST_DEPS) | check-deps
	@mkdir -p $(dir $@)
	$(HOST_CXX) -c $< -o $@
$(BUILD)/tests/%_host: tests/%_host.cc tests/test.h $(HOST_OBJ) $(LIB) | check-deps
	@mkdir -p $(dir $@)
	$(HOST_CXX) -Itests -o $@ $< $(HOST_OBJ) $(LIB) $(HOST_LDLIBS)
$(BUILD)/host_tests/%_host: tests/gpu/%.c tests/gpu/gpu_check.h tests/test.h $(HOST_OBJ) $(LIB) | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=address,undefined -fno-sanitize-recover=all -Itests -Itests/gpu -c $< -o $@.o
	$(HOST_CXX) -o $@ $@.o $(HOST_OBJ) $(LIB) $(HOST_LDLIBS)
# test_dist_fail launches the helper under mpirun (tests/helper_fail.c is not a test itself).
$(BUILD)/tests/test_dist_fail: $(BUILD)/tests/helper_fail

# Each fuzz target links only the sources it exercises.
FUZZ_SRC_fuzz_config := src/config.c src/config_load.c src/util.c
FUZZ_SRC_fuzz_seqfile := $(wildcard src/data*.c) src/minijson.c src/util.c
FUZZ_SRC_fuzz_safetensors := src/safetensors.c src/minijson.c src/strmap.c src/util.c
$(BUILD)/fuzz/%: tests/fuzz/%.c $(SRC)
	@scripts/deps.sh --fuzz
	@mkdir -p $(dir $@)
	clang -g -O1 -std=c11 -fsanitize=fuzzer,address,undefined -Isrc -DMOETRAIN_PREFIX='"$(PREFIX)"' -o $@ $< \
	  $(FUZZ_SRC_$*) $(LIBYAML_A) -lz -lm

# ---- run / test ------------------------------------------------------------------------------
# RUN_DIR: L0_sanity's log.dir (metrics.jsonl; checkpoints under RUN_DIR/ckpt). The picture is
# RUN_DIR/metrics.png; without matplotlib (and no way to install it) the run still counts.
RUN_DIR ?= runs/L0_sanity
run: $(BUILD)/moetrain
	scripts/mpirun.sh -np $(NP) $(BUILD)/moetrain --config L0_sanity $(ARGS)
	@scripts/deps.sh --plot || true
	@scripts/plot.py $(RUN_DIR) -o $(RUN_DIR)/metrics.png || [ $$? -eq 3 ]

test: $(BUILD)/moetrain $(TESTS)
	@scripts/run_tests.sh $(TESTS)

test-gpu: $(if $(filter 1,$(PREBUILT)),,$(BUILD)/moetrain $(GPU_TESTS))
	@scripts/run_tests.sh $(GPU_TESTS)

gpu-tests: $(GPU_TESTS)

# ---- dev/: experiments (kernels that lost their race, surveys, timings, probes) --------------
# Built against libmoetrain.a, never linked into moetrain; a kernel returns to cuda/ when it wins.
ifeq ($(CUDA),1)
dev: $(DEV)
else
dev:
	@echo "make dev needs the CUDA toolkit (nvcc)"; exit 1
endif

$(DEV_LIB): $(DEV_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dev/%: dev/%.c $(DEV_LIB) $(LIB) tests/test.h tests/gpu/gpu_check.h | check-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -Itests/gpu -Idev -o $@ $< $(DEV_LIB) $(LIB) $(LDLIBS)

# racecheck's view of the warp-specialised kernels' stage release (read its header)
$(BUILD)/dev/racecheck_probe: dev/racecheck_probe.cu | check-deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -o $@ $<

bench: $(if $(filter 1,$(PREBUILT)),,$(BUILD)/moetrain)
	MOETRAIN=$(BUILD)/moetrain scripts/bench.sh

# checksum throughput on this CPU (zlib crc32 vs CRC-32C); FILES= also times reading those files
bench-crc: $(BUILD)/tests/bench_crc32c
	$(BUILD)/tests/bench_crc32c $(FILES)

fuzz: $(FUZZ)
	@for f in $(FUZZ); do n=$$(basename $$f); mkdir -p $(BUILD)/fuzz/corpus_$$n; \
	  echo "== $$n ($(FUZZ_SECONDS) s)"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(BUILD)/fuzz/corpus_$$n tests/fuzz/seeds/$$n || exit 1; done

install: $(BUILD)/moetrain
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/moetrain/configs $(DESTDIR)$(PREFIX)/share/moetrain/data
	install -m 755 $(BUILD)/moetrain $(DESTDIR)$(PREFIX)/bin/moetrain
	install -m 644 configs/*.yaml $(DESTDIR)$(PREFIX)/share/moetrain/configs/
	install -m 644 data/*.gz $(DESTDIR)$(PREFIX)/share/moetrain/data/
	install -d $(DESTDIR)$(PREFIX)/share/moetrain/scripts
	install -m 755 $(USER_SCRIPTS) $(DESTDIR)$(PREFIX)/share/moetrain/scripts/
	@# an older install's tokenize.py (now tokenize_data.py) would shadow Python's tokenize module there
	rm -f $(DESTDIR)$(PREFIX)/share/moetrain/scripts/tokenize.py

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
