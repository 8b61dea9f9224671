#!/usr/bin/env bash
# TTFT vs k on one GPU (prompt vs KV injection from the host tier), Llama-3.1-8B shape, random bf16 weights.
# Needs torch and transformers only; no vLLM, no network, no downloads. About 2-4 minutes on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py "$@"
