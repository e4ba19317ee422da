# shellcheck shell=bash
# scripts/gpu_env.sh: sourced (not run) by bench/gpu.sh, tests/gpu/suite.sh and tests/gpu/run.sh to
# build and run on a GPU machine that may lack the libraries shardlm builds against.
#
# gpu_env_setup LOG: when the machine lacks OpenBLAS (openmp) / cJSON / PCRE2 / Open MPI / oneDNN headers or
# libraries and GPU_DEPS_DIR (default build/gpu-deps, made by bench/gpu_deps.sh) holds .deb files, unpacks
# them under /tmp/shardlm-deps/root and links into /tmp/shardlm-deps/shim only the libraries that
# ldconfig does not know; then points CPATH, LIBRARY_PATH, LD_LIBRARY_PATH, BLAS_INC / BLAS_DIR and the
# Makefile's MPI_CFLAGS / MPI_LIBS at them (OPAL_PREFIX too, so the relocated Open MPI finds its MCA
# plugins). Always exports MPI_CFLAGS / MPI_LIBS (from mpicc when there is one) and
# OMPI_MCA_ess_singleton_isolated=1 (a one-process MPI_Init without mpirun / orted). Sets GPU_ENV_MSG to
# one line saying what it did; returns 1 when the dependencies are missing and none were carried.
# Runs once per process tree (GPU_ENV_DONE).

gpu_deps_present() {
    [[ -f "${BLAS_INC:-/usr/include/x86_64-linux-gnu/openblas-openmp}/cblas.h" ]] && command -v mpicc >/dev/null &&
        printf '#include <cjson/cJSON.h>\n#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n#include <utf8proc.h>\n#include <dnnl.h>\n' |
            ${CC:-gcc} -E -x c - >/dev/null 2>&1 &&
        ldconfig -p | grep -q 'libcjson.so ' && ldconfig -p | grep -q 'libpcre2-8.so ' && ldconfig -p | grep -q 'libutf8proc.so ' &&
        ldconfig -p | grep -q 'libdnnl.so '
}

gpu_use_carried_deps() {  # gpu_use_carried_deps LOG
    local dir=${GPU_DEPS_DIR:-build/gpu-deps} P=/tmp/shardlm-deps d f n known
    ls "$dir"/*.deb >/dev/null 2>&1 || return 1
    mkdir -p "$P/root" "$P/shim"
    for d in "$dir"/*.deb; do
        dpkg-deb -x "$d" "$P/root" 2>> "$1" ||
            (mkdir -p "$P/x" && cd "$P/x" && ar x "$OLDPWD/$d" && tar -xf data.tar.* -C "$P/root") || return 1
    done
    known=$(ldconfig -p)
    local L=$P/root/usr/lib/x86_64-linux-gnu
    for f in "$L"/*.so* "$L"/openblas-openmp/*.so* "$L"/openmpi/lib/*.so*; do
        [[ -e "$f" ]] || continue
        n=$(basename "$f")
        grep -q "^[[:space:]]*$n " <<< "$known" && continue
        ln -sf "$(readlink -f "$f")" "$P/shim/$n"
    done
    export CPATH=$P/root/usr/include${CPATH:+:$CPATH}
    export LIBRARY_PATH=$P/shim${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=$P/shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    [[ -f /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h ]] ||
        export BLAS_INC=$P/root/usr/include/x86_64-linux-gnu/openblas-openmp BLAS_DIR=$P/shim
    if ! command -v mpicc >/dev/null; then
        export MPI_CFLAGS="-I$L/openmpi/include -I$L/openmpi/include/openmpi" MPI_LIBS="-L$P/shim -lmpi"
        export OPAL_PREFIX=$P/root/usr   # Debian's plugins: $OPAL_PREFIX/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
    fi
    # shellcheck disable=SC2012
    GPU_ENV_MSG="unpacked $(ls "$dir"/*.deb | wc -l) carried packages from $dir; libraries this machine lacked:"
    # shellcheck disable=SC2012
    GPU_ENV_MSG+=" $(ls "$P/shim" | tr '\n' ' ')"
}

gpu_env_setup() {  # gpu_env_setup LOG
    local rc=0
    GPU_ENV_MSG="build dependencies present"
    if [[ -z "${GPU_ENV_DONE:-}" ]] && ! gpu_deps_present && ! gpu_use_carried_deps "$1"; then
        GPU_ENV_MSG="missing build dependencies (OpenBLAS-openmp / cJSON / PCRE2 / utf8proc / Open MPI / oneDNN headers or libraries) and"
        GPU_ENV_MSG+=" no carried .debs in ${GPU_DEPS_DIR:-build/gpu-deps} (make them with bench/gpu_deps.sh, carry that folder)"
        rc=1
    fi
    export GPU_ENV_DONE=1
    export MPI_CFLAGS=${MPI_CFLAGS-$(mpicc --showme:compile 2>/dev/null)}
    export MPI_LIBS=${MPI_LIBS-$(mpicc --showme:link 2>/dev/null)}
    export OMPI_MCA_ess_singleton_isolated=1
    gpu_use_wheel_libs
    return $rc
}

# A CUDA toolkit without NCCL (or cuBLASLt): use the nvidia-* wheels of the machine's Python (as
# PyTorch does). NCCL_HOME tells the Makefile where nccl.h is; the libraries are dlopen'ed by name,
# so their folders go on LD_LIBRARY_PATH, after anything already there.
gpu_use_wheel_libs() {
    local cuda=${CUDA_HOME:-/usr/local/cuda} site
    site=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)
    [[ -n "$site" ]] || { gpu_pick_cudnn; return 0; }
    if [[ ! -f "$cuda/include/nccl.h" && -f "$site/nvidia/nccl/include/nccl.h" ]]; then
        export NCCL_HOME=$site/nvidia/nccl
        export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$site/nvidia/nccl/lib
    fi
    if ! ls "$cuda"/lib64/libcublasLt.so* >/dev/null 2>&1 && [[ -d "$site/nvidia/cublas/lib" ]]; then
        export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$site/nvidia/cublas/lib
    fi
    # cuDNN (SHARDLM_ATTENTION=cudnn): its header for the build (CUDNN_HOME, read by the Makefile), its
    # libraries for the dlopen (libcudnn.so.9 loads its engine libraries from its own folder)
    if [[ ! -f "$cuda/include/cudnn_graph.h" && -f "$site/nvidia/cudnn/include/cudnn_graph.h" ]]; then
        export CUDNN_HOME=$site/nvidia/cudnn
    fi
    if ! ls "$cuda"/lib64/libcudnn.so.9* >/dev/null 2>&1 && [[ -d "$site/nvidia/cudnn/lib" ]]; then
        export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$site/nvidia/cudnn/lib
    fi
    gpu_pick_cudnn "$site/nvidia/cudnn/lib/libcudnn.so.9"
    return 0
}

# gpu_pick_cudnn [FILE...]: a GPU machine may hold several cuDNN 9 libraries (the toolkit's, the
# nvidia-cudnn wheel PyTorch brings, the system's), and cuDNN's fused attention kernels change from
# release to release (on the H200 of 2026-11-28 the toolkit's 9.14 ran GPT-2's attention backward at
# 1.56 ms a layer where PyTorch's 9.19 took 1.02). Each candidate's version comes from
# cudnnGetVersion in a Python process of its own (two cuDNN versions must not meet in one process),
# and one built for another CUDA major than the toolkit's nvcc (cudnnGetCudartVersion) is left out;
# GPU_CUDNN_LIBS lists the first file found of each version ("VERSION=FILE ...", newest first) for the
# logs and bench/gpu.sh's comparison row, and SHARDLM_CUDNN_LIBRARY is set to the newest unless set.
gpu_pick_cudnn() {
    local cuda=${CUDA_HOME:-/usr/local/cuda} f v rt real major seen=" " found=()
    major=$("$cuda/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    for f in "$cuda/lib64/libcudnn.so.9" "$@" $(ldconfig -p 2>/dev/null | awk '/libcudnn\.so\.9 /{print $NF}'); do
        [[ -e "$f" && "$f" != *" "* ]] || continue   # (the lists below are split on spaces)
        real=$(readlink -f "$f")
        [[ "$seen" == *" $real "* ]] && continue
        seen+="$real "
        read -r v rt < <(python3 -c 'import ctypes, sys; l = ctypes.CDLL(sys.argv[1])
print(l.cudnnGetVersion(), l.cudnnGetCudartVersion())' "$f" 2>/dev/null) || continue
        [[ "$v" =~ ^[0-9]+$ && "$rt" =~ ^[0-9]+$ ]] || continue
        # a cuDNN built for another CUDA major than the toolkit's (a cu12 wheel beside CUDA 13) is left out
        [[ -z "$major" || $((rt / 1000)) -eq "$major" ]] || continue
        [[ " ${found[*]} " != *" $v="* ]] && found+=("$v=$f")  # one file a version
    done
    (( ${#found[@]} )) || return 0
    GPU_CUDNN_LIBS=$(printf '%s\n' "${found[@]}" | sort -t= -k1,1nr | tr '\n' ' ')
    export GPU_CUDNN_LIBS=${GPU_CUDNN_LIBS% }
    if [[ -z "${SHARDLM_CUDNN_LIBRARY:-}" ]]; then
        f=${GPU_CUDNN_LIBS%% *}
        export SHARDLM_CUDNN_LIBRARY=${f#*=}
    fi
    GPU_ENV_MSG+="; cuDNN found: $GPU_CUDNN_LIBS; SHARDLM_CUDNN_LIBRARY=$SHARDLM_CUDNN_LIBRARY"
}
