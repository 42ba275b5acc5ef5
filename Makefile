# cgspn — see README.md. `make` builds ./cgspn; `make test` runs the CMocka suite (CI);
# `make demo` runs the Fashion-MNIST pipeline; `make test-gpu` / `make bench` need a GPU.
CC      ?= gcc
CFLAGS  ?= -O3
CFLAGS  += -std=c11 -D_DEFAULT_SOURCE -D_POSIX_C_SOURCE=200809L -fopenmp -Wall -Wextra \
           -Wno-unused-parameter -MMD -MP
LDLIBS  += -lpng -lturbojpeg -lzstd -lz -lm -lpthread
BUILD   := build

# Optional toolchains, detected by compiling probes (tools/probe.sh), cached in build/config.mk.
$(BUILD)/config.mk: tools/probe.sh
	@mkdir -p $(BUILD)
	@bash tools/probe.sh $@
-include $(BUILD)/config.mk

SRC_C   := $(wildcard nn/*.c train/*.c data/*.c dist/*.c kernels/*.c kernels/cpu/*.c)
SRC_CU  := $(wildcard kernels/cuda/*.cu)
MAIN_O  := $(BUILD)/train/main.o
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
LDLIBS    += -lcudnn
endif
LINK      := $(NVCC) $(CUDA_ARCH) -Xcompiler -fopenmp
LINKFLAGS := -Xlinker -rpath,$(CUDA_HOME)/lib64
else
LINK      := $(CC) -fopenmp
LINKFLAGS :=
endif

TESTS_C   := $(wildcard tests/test_*.c)
TEST_BINS := $(TESTS_C:tests/%.c=$(BUILD)/tests/%)
GPU_TESTS_C   := $(wildcard tests/gpu/test_*.c)
GPU_TEST_BINS := $(GPU_TESTS_C:tests/gpu/%.c=$(BUILD)/tests/gpu/%)

.PHONY: all deps test test-gpu demo bench clean
all: cgspn

deps:
	@bash tools/install_deps.sh

# Everything but main goes into one archive, so a test links only the objects it uses.
LIB := $(BUILD)/libcgspn_core.a
$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

cgspn: $(MAIN_O) $(LIB)
	$(LINK) $(LINKFLAGS) -o $@ $(MAIN_O) $(LIB) $(LDLIBS)

$(BUILD)/%.o: %.c $(BUILD)/config.mk
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu $(BUILD)/config.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/tests/gpu/%: tests/gpu/%.c tests/testlib.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CMOCKA_CFLAGS) -c $< -o $@.o
	$(LINK) $(LINKFLAGS) -o $@ $@.o $(LIB) $(CMOCKA_LIBS) $(LDLIBS)

$(BUILD)/tests/%: tests/%.c tests/testlib.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CMOCKA_CFLAGS) -c $< -o $@.o
	$(LINK) $(LINKFLAGS) -o $@ $@.o $(LIB) $(CMOCKA_LIBS) $(LDLIBS)

# Every CPU test binary runs, even after a failure; the target fails if any did.
test: deps
	@$(MAKE) --no-print-directory $(TEST_BINS) cgspn
	@fail=0; for t in $(TEST_BINS); do echo "== $$t"; $$t || fail=1; done; \
	 if [ $$fail -ne 0 ]; then echo "make test: FAILED"; exit 1; fi; echo "make test: all passed"

# On the GPU machine: every CUDA op against the CPU reference.
test-gpu:
ifneq ($(CUDA_ON),1)
	@echo "make test-gpu: no working nvcc found (see build/config.mk)"; exit 1
else
	@$(MAKE) --no-print-directory $(GPU_TEST_BINS) cgspn
	@fail=0; for t in $(GPU_TEST_BINS); do echo "== $$t"; $$t || fail=1; done; \
	 if [ $$fail -ne 0 ]; then echo "make test-gpu: FAILED"; exit 1; fi; echo "make test-gpu: all passed"
endif

demo: deps cgspn
	@bash tools/demo.sh

clean:
	rm -rf $(BUILD) cgspn

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
