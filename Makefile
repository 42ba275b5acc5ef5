# cgspn — see README.md. `make` builds ./cgspn; `make test` runs the CMocka suite (CI);
# `make demo` runs the Fashion-MNIST pipeline; `make test-gpu` / `make bench` need a GPU.
SHELL   := /bin/bash
CC      ?= gcc
CFLAGS  ?= -O3
CFLAGS  += -std=c11 -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L -fopenmp -Wall -Wextra \
           -Wno-unused-parameter -MMD -MP
LDLIBS  += -lpng -lturbojpeg -lzstd -lz -lm -lpthread
BUILD   := build
NPROC   := $(shell nproc 2>/dev/null || echo 2)

.DEFAULT_GOAL := all

# Optional toolchains, detected by compiling probes (tools/probe.sh), cached in build/config.mk.
# The cache is dropped, and the probe runs again, whenever what it would find can have changed
# (tools/probe.sh --signature: a tool or header installed or removed). `make test`, `make demo`
# and `make fmnist-shards` install packages first and then build in a make of their own, which
# reads the findings made after the install.
ifneq ($(shell bash tools/probe.sh --signature),$(shell sed -n 's/^PROBE_SIGNATURE := //p' $(BUILD)/config.mk 2>/dev/null))
$(shell rm -f $(BUILD)/config.mk)
endif
$(BUILD)/config.mk: tools/probe.sh tools/install_deps.sh
	@mkdir -p $(BUILD)
	@bash tools/probe.sh $@
-include $(BUILD)/config.mk

# Layers (README, docs/layout.md): kernels/ (the base, the op table, the device interface and
# the backends) <- nn/ <- train/; data/ and dist/ beside them; bench/ above train/; app/main.c,
# the command table, on top. tools/check_layers.py keeps the includes pointing one way.
SRC_C   := $(wildcard kernels/*.c kernels/cpu/*.c nn/*.c data/*.c dist/*.c train/*.c bench/*.c) app/main.c
SRC_CU  := $(wildcard kernels/cuda/*.cu bench/cuda/*.cu)
MAIN_O  := $(BUILD)/app/main.o
OBJ     := $(filter-out $(MAIN_O),$(SRC_C:%.c=$(BUILD)/%.o))

ifeq ($(HAVE_NVCC),1)
ifneq ($(SRC_CU),)
CUDA_ON := 1
endif
endif

ifeq ($(CUDA_ON),1)
# The GPU present (probe), else a fat binary for A100 and H100 users. sm_90 gets sm_90a so the
# Hopper paths build; kernels that use them keep a portable fallback.
ifneq ($(GPU_SM),)
  ifeq ($(GPU_SM),90)
    CUDA_ARCH := -gencode arch=compute_90a,code=sm_90a
  else
    CUDA_ARCH := -gencode arch=compute_$(GPU_SM),code=sm_$(GPU_SM)
  endif
else
  CUDA_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a \
               -gencode arch=compute_90,code=compute_90
endif
NVCCFLAGS ?= -O3
NVCCFLAGS += -std=c++17 $(CUDA_ARCH) -DCGSPN_CUDA -lineinfo -Xcompiler -fopenmp,-Wall -MMD -MP
CFLAGS    += -DCGSPN_CUDA -I$(CUDA_HOME)/include
OBJ       += $(SRC_CU:%.cu=$(BUILD)/%.o)
LDLIBS    += -L$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas
ifeq ($(HAVE_CUDNN),1)
CUDNN_LIBS ?= -lcudnn
NVCCFLAGS += -DCGSPN_HAVE_CUDNN $(CUDNN_CFLAGS)
LDLIBS    += $(CUDNN_LIBS)
endif
# The fused-epilogue GEMMs (kernels/cuda/gemm_cutlass.cu: CUTLASS's sm_90 kernels), the fused
# MLP and the stem's tap-product convolution (kernels/cuda/mlp_fused.cu, conv2d_taps.cu: warpgroup
# MMAs through CUTLASS's cute/arch), built for sm_90a alone (a fat binary's other targets would
# compile them again for nothing); on another GPU, or without CUTLASS (tools/fetch_cutlass.sh),
# the erf GELU runs unfused, the MLP as two ops, the convolution through its columns and the
# rest on cuBLASLt.
ifeq ($(HAVE_CUTLASS),1)
ifeq ($(filter-out 90,$(GPU_SM)),)
SM90A_OBJS := $(BUILD)/kernels/cuda/gemm_cutlass.o $(BUILD)/kernels/cuda/mlp_fused.o \
              $(BUILD)/kernels/cuda/conv2d_taps.o
$(SM90A_OBJS): NVCCFLAGS += -DCGSPN_HAVE_CUTLASS -DNDEBUG $(CUTLASS_CFLAGS) --expt-relaxed-constexpr
$(SM90A_OBJS): CUDA_ARCH := -gencode arch=compute_90a,code=sm_90a
CFLAGS    += -DCGSPN_HAVE_CUTLASS
endif
endif
ifeq ($(HAVE_NCCL),1)
CFLAGS    += -DCGSPN_HAVE_NCCL
LDLIBS    += -lnccl
endif
LINK      := $(NVCC) $(CUDA_ARCH) -Xcompiler -fopenmp
# nvcc links: it takes OpenMP through -Xcompiler above and rejects a bare -fopenmp, and it
# takes linker flags as -Xlinker a,b rather than gcc's -Wl,a,b (CMOCKA_LIBS from tools/probe.sh).
LDLIBS    := $(filter-out -fopenmp,$(LDLIBS))
comma     := ,
CMOCKA_LIBS := $(subst -Wl$(comma),-Xlinker ,$(CMOCKA_LIBS))
LINKFLAGS := -Xlinker -rpath,$(CUDA_HOME)/lib64
# dispatch.c reaches the CUDA kernels only through weak references, and a weak reference does
# not pull a member out of an archive: every link names the CUDA objects itself.
CUDA_OBJ  := $(SRC_CU:%.cu=$(BUILD)/%.o)
else
LINK      := $(CC) -fopenmp
LINKFLAGS :=
endif

# Multi-process runs (dist/): MPI when tools/probe.sh found mpicc. The binary links libmpi but
# calls MPI only when an MPI launcher started it (dist/dist.h).
ifeq ($(HAVE_MPI),1)
CFLAGS    += -DCGSPN_HAVE_MPI $(MPI_CFLAGS)
ifeq ($(CUDA_ON),1)
LDLIBS    += $(subst -Wl$(comma),-Xlinker ,$(MPI_LDFLAGS))
else
LDLIBS    += $(MPI_LDFLAGS)
endif
endif

TESTS_C   := $(wildcard tests/test_*.c)
# test_dist_mpi and test_dist_train run under mpirun -np 2 (below), not on their own.
MPI_TEST  := $(BUILD)/tests/test_dist_mpi
MPI_TRAIN_TEST := $(BUILD)/tests/test_dist_train
TEST_BINS := $(filter-out $(MPI_TEST) $(MPI_TRAIN_TEST),$(TESTS_C:tests/%.c=$(BUILD)/tests/%))
MPIRUN    := mpirun --allow-run-as-root --oversubscribe
GPU_TESTS_C   := $(wildcard tests/gpu/test_*.c)
GPU_TEST_BINS := $(GPU_TESTS_C:tests/gpu/%.c=$(BUILD)/tests/gpu/%)

.PHONY: all deps test test-run test-gpu sanitize-gpu demo demo-run bench bench-gspn clean fmnist-shards \
        fmnist-shards-run required-headers
all: cgspn

deps:
	@bash tools/install_deps.sh

# Before compiling anything: the headers ./cgspn needs (tools/install_deps.sh's build group), or
# one line naming the packages instead of a compiler error.
required-headers:
ifneq ($(strip $(MISSING_BUILD_PACKAGES)),)
	@echo "cgspn: cannot build: missing $(strip $(MISSING_BUILD_PACKAGES)) (headers such as zstd.h, png.h, turbojpeg.h); run make deps, or apt-get install $(strip $(MISSING_BUILD_PACKAGES))"; exit 1
else
	@true
endif

# Everything but main goes into one archive, so a test links only the objects it uses.
LIB := $(BUILD)/libcgspn_core.a
$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

cgspn: $(MAIN_O) $(LIB)
	$(LINK) $(LINKFLAGS) -o $@ $(MAIN_O) $(CUDA_OBJ) $(LIB) $(LDLIBS)

$(BUILD)/%.o: %.c $(BUILD)/config.mk | required-headers
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(BUILD)/config.mk | required-headers
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/tests/gpu/%: tests/gpu/%.c tests/testlib.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CMOCKA_CFLAGS) -c $< -o $@.o
	$(LINK) $(LINKFLAGS) -o $@ $@.o $(CUDA_OBJ) $(LIB) $(CMOCKA_LIBS) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/testlib.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CMOCKA_CFLAGS) -c $< -o $@.o
	$(LINK) $(LINKFLAGS) -o $@ $@.o $(CUDA_OBJ) $(LIB) $(CMOCKA_LIBS) $(LDLIBS)

# The CPU GEMM's GFLOP/s on the Fashion-MNIST ViT's shapes.
$(BUILD)/bench/cpu/gemm_bench: bench/cpu/gemm_bench.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@.o
	$(LINK) $(LINKFLAGS) -o $@ $@.o $(CUDA_OBJ) $(LIB) $(LDLIBS)

# libcgspn.so: the C-GSPN scan and GSPN-1's gate recurrence behind the stable C ABI of
# kernels/cgspn.h (tools/cgspn_torch.py loads it). Only the objects the ABI needs, compiled
# position-independent into build/pic/ with every symbol hidden but the cgspn_* functions; the
# CUDA context, the scan kernel and the gate recurrence kernel join when CUDA is on.
# --no-undefined makes a missing object a link error here rather than at load time.
PIC_DIR    := $(BUILD)/pic
LIBSO_C    := kernels/cgspn_abi.c kernels/cpu/gspn_scan.c kernels/cpu/gate_recurrent.c kernels/error.c \
              kernels/tensor.c kernels/alloc_count.c
LIBSO_OBJ  := $(LIBSO_C:%.c=$(PIC_DIR)/%.o)
LIBSO_LIBS := -lm
ifeq ($(CUDA_ON),1)
LIBSO_CU   := $(filter kernels/cuda/cuda_ctx.cu kernels/cuda/gspn_scan%.cu kernels/cuda/gate_recurrent.cu,$(SRC_CU))
LIBSO_OBJ  += $(LIBSO_CU:%.cu=$(PIC_DIR)/%.o)
LIBSO_LIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++
endif

.PHONY: lib clean-lib
lib: libcgspn.so

libcgspn.so: $(LIBSO_OBJ)
	$(CC) -shared -fopenmp -Wl,--no-undefined -o $@ $^ $(LIBSO_LIBS)

$(PIC_DIR)/%.o: %.c $(BUILD)/config.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -fvisibility=hidden -c $< -o $@

$(PIC_DIR)/%.o: %.cu $(BUILD)/config.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC,-fvisibility=hidden -c $< -o $@

clean: clean-lib
clean-lib:
	rm -f libcgspn.so

# `make test` installs what is missing, then runs test-run in a new make (the probe's findings
# after the install). The layering check first (tools/check_layers.py and its planted-violation test), then every
# CPU test binary, even after a failure; the target fails if any did.
# Then the 2-rank tests under mpirun (when tools/probe.sh found MPI).
# With nvcc present the GPU tests are built too (not run): GPU code must always compile.
test: deps
	@$(MAKE) --no-print-directory test-run

test-run:
	@$(MAKE) --no-print-directory -j$(NPROC) $(TEST_BINS) $(if $(filter 1,$(HAVE_MPI)),$(MPI_TEST) $(MPI_TRAIN_TEST)) cgspn lib \
	   $(if $(filter 1,$(CUDA_ON)),$(GPU_TEST_BINS))
	@bash tools/fmnist_shards.sh   # so the README's recipes (and mpirun -np 2 ...) run right after
	@fail=0; echo "== tests/test_layers.sh (tools/check_layers.py)"; bash tests/test_layers.sh || fail=1; \
	 echo "== tests/test_build_probe.sh (the probe follows what is installed)"; bash tests/test_build_probe.sh || fail=1; \
	 echo "== tests/test_no_history.sh (the code speaks of the project)"; bash tests/test_no_history.sh || fail=1; \
	 echo "== tests/test_doc_refs.sh (every docs reference points somewhere)"; bash tests/test_doc_refs.sh || fail=1; \
	 echo "== tests/test_ncu_stalls.sh (tools/ncu_stalls.py on a planted profile)"; bash tests/test_ncu_stalls.sh || fail=1; \
	 for t in $(TEST_BINS); do echo "== $$t"; $$t || fail=1; done; \
	 if [ "$(HAVE_MPI)" = 1 ]; then \
	   echo "== $(MPIRUN) -np 2 $(MPI_TEST)"; $(MPIRUN) -np 2 $(MPI_TEST) || fail=1; \
	   echo "== $(MPIRUN) -np 2 $(MPI_TRAIN_TEST)"; $(MPIRUN) -np 2 $(MPI_TRAIN_TEST) || fail=1; \
	   echo "== tests/test_dist_fault.sh"; MPIRUN="$(MPIRUN)" bash tests/test_dist_fault.sh $(MPI_TEST) ./cgspn || fail=1; \
	 elif [ "$${CI:-}" = true ]; then \
	   echo "== FAILED: the multi-process tests (test_dist_mpi, test_dist_train, test_dist_fault.sh) cannot run: this build has no MPI (no mpicc when tools/probe.sh ran); CI must run them: make deps installs libopenmpi-dev openmpi-bin"; fail=1; \
	 else echo "!! SKIPPED the multi-process tests (test_dist_mpi, test_dist_train, test_dist_fault.sh): this build has no MPI (no mpicc when tools/probe.sh ran); make deps (or apt-get install libopenmpi-dev openmpi-bin) installs it, then make test"; fi; \
	 if [ $$fail -ne 0 ]; then echo "make test: FAILED"; exit 1; fi; echo "make test: all passed"

# On the GPU machine: every CUDA op against the CPU reference.
test-gpu:
ifneq ($(CUDA_ON),1)
	@echo "make test-gpu: no working nvcc found (see build/config.mk)"; exit 1
else
	@$(MAKE) --no-print-directory -j$(NPROC) $(GPU_TEST_BINS) cgspn lib
	@fail=0; for t in $(GPU_TEST_BINS); do echo "== $$t"; $$t || fail=1; done; \
	 echo "== tests/gpu/test_torch_wrapper.py (libcgspn.so through PyTorch)"; \
	 python3 tests/gpu/test_torch_wrapper.py || fail=1; \
	 echo "== tests/gpu/test_gate_recurrent_torch.py (the gate recurrence through PyTorch)"; \
	 python3 tests/gpu/test_gate_recurrent_torch.py || fail=1; \
	 if [ $$fail -ne 0 ]; then echo "make test-gpu: FAILED"; exit 1; fi; echo "make test-gpu: all passed"
endif

# On the GPU machine: every GPU test binary under compute-sanitizer's memcheck (with leak check),
# racecheck and initcheck, at the tests' small shapes (tools/sanitize_gpu.sh).
sanitize-gpu:
ifneq ($(CUDA_ON),1)
	@echo "make sanitize-gpu: no working nvcc found (see build/config.mk)"; exit 1
else
	@$(MAKE) --no-print-directory -j$(NPROC) $(GPU_TEST_BINS)
	@bash tools/sanitize_gpu.sh
endif

# Every benchmark on the GPU; the output (device and date first) is kept in build/bench.txt,
# and tools/readme_bench.py copies it into docs/benchmarks.md (and README.md's headline) as produced. PyTorch's numbers first
# (bench/bench_timm.py -> build/bench_timm.json, when python3 has torch and timm): `cgspn bench
# vit`, `block`, `distill --memory=1` (grad_checkpoint 0 and 1) and `distill --max-batch` (the
# largest batch at 378 and 1036 px) print them beside their own, with the ratios.
bench:
ifneq ($(CUDA_ON),1)
	@echo "make bench: no working nvcc found (see build/config.mk)"; exit 1
else
	@$(MAKE) --no-print-directory cgspn
	@if python3 -c 'import torch, timm' 2>/dev/null; then \
	   python3 bench/bench_timm.py --out $(BUILD)/bench_timm.json || \
	   echo "make bench: bench/bench_timm.py reported failures (see above); going on"; \
	 else echo "make bench: python3 has no torch and timm: no PyTorch columns"; fi
	set -o pipefail; ./cgspn bench all 2>&1 | tee $(BUILD)/bench.txt
	set -o pipefail; ./cgspn bench distill --memory=1 2>&1 | tee -a $(BUILD)/bench.txt
	set -o pipefail; ./cgspn bench distill --max-batch 2>&1 | tee -a $(BUILD)/bench.txt
endif

# The Fashion-MNIST shards the fmnist configs train on (data/shards/fmnist), built once from
# the Debian dataset (FMNIST_SRC=DIR for another IDX folder).
fmnist-shards:
	@bash tools/install_deps.sh build data
	@$(MAKE) --no-print-directory fmnist-shards-run

fmnist-shards-run: cgspn
	@bash tools/fmnist_shards.sh

demo:
	@bash tools/install_deps.sh build data
	@$(MAKE) --no-print-directory demo-run

demo-run: cgspn fmnist-shards-run
	@bash tools/demo.sh

clean:
	rm -rf $(BUILD) cgspn

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
