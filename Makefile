# shardlm build. `make` builds build/shardlm; `make test` builds and runs every test, first
# normally and then under AddressSanitizer + UndefinedBehaviorSanitizer; `make bench` runs benchmarks.
CC      ?= gcc
BLAS_DIR ?= /usr/lib/x86_64-linux-gnu/openblas-openmp
BLAS_INC ?= /usr/include/x86_64-linux-gnu/openblas-openmp
WARN    := -std=c17 -Wall -Wextra -Werror -D_GNU_SOURCE
# MPI_CFLAGS / MPI_LIBS: overridable (scripts/gpu_env.sh points them at carried Open MPI packages)
MPI_CFLAGS ?= $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   ?= $(shell mpicc --showme:link 2>/dev/null)
CPPFLAGS := -Iinclude -Isrc -I$(BLAS_INC) $(MPI_CFLAGS)
# ARCH: the instruction sets the C code is compiled for. native (default): this machine's, the fastest
# here; a binary started on a CPU lacking one of them stops with a message (src/cli/main.c). For one
# binary across machines: ARCH=x86-64-v3 (AVX2 + FMA) or x86-64-v4 (AVX-512). The GEMM libraries
# (OpenBLAS, oneDNN) pick their kernels at run time either way.
ARCH    ?= native
OPT     ?= -O3 -march=$(ARCH) -fno-fast-math -fno-math-errno -fno-trapping-math
LDLIBS  := -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -ldnnl -lcjson -lpcre2-8 -lutf8proc $(MPI_LIBS) -lm
B       ?= build

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/cli/*' | sort)
CLI_SRC  := $(shell find src/cli -name '*.c' | sort)
TEST_SRC := $(shell find tests/unit -name 'test_*.c' | sort)

LIB_OBJ  := $(LIB_SRC:%.c=$(B)/obj/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(B)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(B)/tests/%)

# -fno-math-errno / -fno-trapping-math let GCC vectorise math without changing any result
CFLAGS_ALL = $(WARN) $(OPT) -fopenmp -g -MMD -MP

CUDA_HOME ?= /usr/local/cuda

# CUDA ops backend (src/**/*.cu): compiled in when $(CUDA_HOME)/bin/nvcc exists; CUDA=0 disables it.
# The .cu files are compiled by nvcc with NVCCFLAGS only (never OPT: sanitizer builds get plain CUDA
# objects) into $(CU_B)/obj/...cu.o inside libshardlm.a. Binaries link the static CUDA runtime
# (libcudart_static: no libcudart.so needed at run time; without a driver the backend reports "no usable
# CUDA GPU"; -lstdc++ for the C++ runtime bits of CUB / nvcc's host code), and libcublasLt is
# dlopen'ed by the backend at init. CUDA_GENCODE picks the GPU code:
# SASS for sm_90 (H100/H200) plus compute_90 PTX, which the driver JIT-compiles for newer GPUs.
CUDA ?= $(shell test -x $(CUDA_HOME)/bin/nvcc && echo 1)
NVCC ?= $(CUDA_HOME)/bin/nvcc
CUDA_GENCODE ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CUDA_ARCH_DESC ?= sm_90 + PTX
NVCCFLAGS = -std=c++17 -O3 -Iinclude -Isrc $(CUDA_GENCODE) -Xcompiler -Wall,-Wextra -Werror all-warnings \
            -lineinfo -MMD -MP
# cuDNN's header for SHARDLM_ATTENTION=cudnn (src/ops/cuda/attention_cudnn.cu, libcudnn dlopen'ed at run
# time): the toolkit's include folder, or CUDNN_HOME/include (e.g. the nvidia-cudnn wheel's folder);
# without it that path reports that it was built without cuDNN.
ifneq ($(CUDNN_HOME),)
NVCCFLAGS += -isystem $(CUDNN_HOME)/include
endif
# CU_B: where the CUDA objects go; `make test` points the sanitizer build at the plain build's (the
# objects are identical, and nvcc is the slow part of a build).
CU_B ?= $(B)
ifeq ($(CUDA),1)
CU_SRC   := $(shell find src -name '*.cu' | sort)
CU_OBJ   := $(CU_SRC:%.cu=$(CU_B)/obj/%.cu.o)
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lpthread -lstdc++
LDLIBS   += $(CUDA_LIBS)
$(B)/obj/src/ops/backend.o $(B)/obj/src/cli/report.o: CPPFLAGS += -DSHARDLM_HAVE_CUDA
$(B)/obj/src/cli/report.o: CPPFLAGS += -DSHARDLM_CUDA_ARCH_DESC='"$(CUDA_ARCH_DESC)"'
$(B)/tests/test_attention_cudnn: CPPFLAGS += -DSHARDLM_HAVE_CUDA
endif

# NCCL comm backend (src/comm/comm_nccl.c): compiled in when nccl.h and libnccl exist under
# NCCL_HOME (default CUDA_HOME; lib64/ or lib/, e.g. the nvidia-nccl wheel's folder). libnccl and
# libcudart are dlopen'ed at run time, so it links nothing from CUDA. NCCL=0 disables it.
NCCL_HOME ?= $(CUDA_HOME)
NCCL ?= $(shell test -f $(NCCL_HOME)/include/nccl.h && test -f $(CUDA_HOME)/include/cuda_runtime_api.h && \
          ls $(NCCL_HOME)/lib64/libnccl.so* $(NCCL_HOME)/lib/libnccl.so* 2>/dev/null | grep -q . && echo 1)
ifeq ($(NCCL),1)
$(B)/obj/src/comm/comm.o $(B)/obj/src/comm/comm_nccl.o: CPPFLAGS += -DSHARDLM_HAVE_NCCL -isystem $(NCCL_HOME)/include \
  -isystem $(CUDA_HOME)/include
endif
# where sl_cuda_dlopen looks first (src/base/cuda_dlopen.c)
$(B)/obj/src/base/cuda_dlopen.o: CPPFLAGS += -DSHARDLM_CUDA_LIBDIR='"$(CUDA_HOME)/lib64"'

.PHONY: all test test-plain test-gpu test-gpu-suite bench bench-finetune bench-gemm-libs bench-gpu demo clean fuzz
all: $(B)/shardlm $(TEST_BIN)

$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS_ALL) -c $< -o $@

$(CU_B)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(B)/libshardlm.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/shardlm: $(CLI_OBJ) $(B)/libshardlm.a
	$(CC) $(CFLAGS_ALL) $^ -o $@ $(LDLIBS)

$(B)/tests/%: tests/unit/%.c tests/unit/test.h $(B)/libshardlm.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS_ALL) -Itests/unit $< $(B)/libshardlm.a -o $@ $(LDLIBS)

# The full test run: plain build, then the sanitizer build and the fuzz targets, one summary line at
# the end (tests/cli/test_fuzz.sh runs each fuzz target for a bounded time in the sanitizer pass).
test:
	@bash scripts/setup.sh --quiet
	@$(MAKE) --no-print-directory -j2 all
	@$(MAKE) --no-print-directory -j2 B=build/asan CU_B=build OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" all
	@$(MAKE) --no-print-directory fuzz
	@bash tests/run.sh build build/asan

# libFuzzer targets (tests/fuzz/fuzz_*.c, one per parser): the library rebuilt by clang with coverage
# instrumentation and ASan/UBSan in build/fuzz, each target linked with libFuzzer's main.
FUZZ_B   := build/fuzz
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_BIN := $(patsubst tests/fuzz/%.c,$(FUZZ_B)/bin/%,$(sort $(wildcard tests/fuzz/fuzz_*.c)))
fuzz:
	@$(MAKE) --no-print-directory -j2 B=$(FUZZ_B) CC=clang CUDA=0 NCCL=0 OPT="-O1 -Wno-pass-failed -fsanitize=fuzzer-no-link $(FUZZ_SAN)" $(FUZZ_B)/libshardlm.a
	@$(MAKE) --no-print-directory -j2 CUDA=0 NCCL=0 $(FUZZ_BIN)

$(FUZZ_B)/bin/%: tests/fuzz/%.c tests/fuzz/fuzz_common.h $(FUZZ_B)/libshardlm.a
	@mkdir -p $(dir $@)
	clang $(CPPFLAGS) $(WARN) -g -O1 -fsanitize=fuzzer $(FUZZ_SAN) -fopenmp $< $(FUZZ_B)/libshardlm.a -o $@ $(LDLIBS)

test-plain: all
	@bash tests/run.sh build

# The NCCL backend against the MPI one on 2 GPUs (needs a GPU machine; not part of `make test`).
test-gpu: all
	@bash tests/gpu/run.sh

# The whole GPU verification (tests/gpu/suite.sh: builds build/gpu itself; PART=build|ops|train|all).
test-gpu-suite:
	@bash tests/gpu/suite.sh $(or $(PART),all)

# The main job on the built-in default: setup, build, prepare ../shared/data/sotu, train, sample.
demo:
	@bash scripts/demo.sh

bench: all
	@bash bench/run.sh

# Fine-tuning (LoRA / QLoRA) against PEFT + bitsandbytes: 15-25 minutes on 2 cores, so not in `bench`;
# needs PYTHON= an interpreter with torch, transformers, peft and bitsandbytes
bench-finetune:
	@bash bench/finetune.sh

# fp32 GEMM library: OpenBLAS against oneDNN's sgemm in whole training steps (about 8 minutes on 2 cores)
bench-gemm-libs: all
	@bash bench/gemm_libs.sh

# The GPU benchmark against PyTorch (one call on a GPU machine; bench/gpu.sh builds what it needs)
bench-gpu:
	@bash bench/gpu.sh

clean:
	rm -rf build

-include $(sort $(shell find $(B) $(CU_B) -name '*.d' 2>/dev/null))
