#!/usr/bin/env bash
# The GPU check in one command, on a CUDA machine with lstm_tvm importable, run from the
# repository root: the `gpu` tests (every op and CellGradMatmul against the float64 reference
# on the GPU), then the timing table against PyTorch's cuDNN LSTM (python -m lstm_tvm.bench.cuda).
#   scripts/gpu_check.sh [OUT_DIR]      (default: gpu-check/; logs and bench.json go there)
# GPU_CHECK_WORKERS: pytest-xdist workers (default 8); BENCH_ARGS: extra bench options;
# TESTS_TIMEOUT, BENCH_TIMEOUT: seconds each stage may run (default 1800).
# GPU_CHECK_TENSOR_CORES=1: then also the float16 forward tests and the bench with
# LSTM_TVM_CUDA_TENSOR_CORES=1 (experimental tensor-core kernels; tc-pytest.txt, tc-bench.json).
set -uo pipefail
out=${1:-gpu-check}
mkdir -p "$out"
python=${PYTHON:-python3}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  command -v nvcc && nvcc --version | tail -1
  "$python" -c "import tvm, lstm_tvm; d = tvm.cuda(0); print('tvm', tvm.__version__, 'cuda(0)', \
d.exist, d.compute_version if d.exist else '-', 'lstm_tvm', lstm_tvm.__version__)"
} 2>&1 | tee "$out/device.txt"
"$python" -c "import sys, tvm; sys.exit(0 if tvm.cuda(0).exist else 'TVM sees no CUDA device')" \
  || exit 2
timeout "${TESTS_TIMEOUT:-1800}" "$python" -m pytest -m gpu -p no:cacheprovider -q \
  -n "${GPU_CHECK_WORKERS:-8}" --dist load -o addopts="-ra" tests/test_cuda.py 2>&1 \
  | tee "$out/pytest.txt"
tests=$?
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-1800}" "$python" -m lstm_tvm.bench.cuda --json "$out/bench.json" \
  ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.txt"
bench=$?
tc=0
if [ "${GPU_CHECK_TENSOR_CORES:-0}" = 1 ]; then
  export LSTM_TVM_CUDA_TENSOR_CORES=1
  timeout "${TESTS_TIMEOUT:-1800}" "$python" -m pytest -m gpu -p no:cacheprovider -q \
    -n "${GPU_CHECK_WORKERS:-8}" --dist load -o addopts="-ra" -k "float16 and BlockLSTM" \
    tests/test_cuda.py 2>&1 | tee "$out/tc-pytest.txt"
  tc=$?
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-1800}" "$python" -m lstm_tvm.bench.cuda --json "$out/tc-bench.json" \
    ${BENCH_ARGS:-} 2>&1 | tee "$out/tc-bench.txt"
  tc=$(( tc || $? ))
fi
echo "gpu tests exit $tests, bench exit $bench, tensor cores exit $tc"
exit $(( tests || bench || tc ))
