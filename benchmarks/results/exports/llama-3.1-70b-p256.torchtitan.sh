#!/usr/bin/env bash
# torchtitan 0.3 launch written by pase: runs the plan dp=128,tp=1,cp=2,zero=3,recompute=op,microbatch=1
# torchtitan 0.3.0: torchrun -m torchtitan.train, parsed by its ConfigManager
# (--module, --config, then Trainer.Config's fields, the activation-checkpoint subcommand last)
# model: torchtitan's llama3 70B (Llama 3.1: 80 layers, width 8192, 64 heads), its config function llama3_70b
# CUDA graphs off (--training.disable_cuda_graphs): the step is priced with eager kernel launches
set -euo pipefail
torchrun --nnodes 32 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:?}:${MASTER_PORT:-29500}" -m torchtitan.train \
  --module llama3 --config llama3_70b \
  --parallelism.data_parallel_replicate_degree 1 \
  --parallelism.data_parallel_shard_degree 128 \
  --parallelism.tensor_parallel_degree 1 \
  --parallelism.pipeline_parallel_degree 1 \
  --parallelism.context_parallel_degree 2 \
  --parallelism.expert_parallel_degree 1 \
  --parallelism.fsdp_reshard_after_forward always \
  --training.local_batch_size 1 \
  --training.global_batch_size 512 \
  --training.seq_len 8192 \
  --training.disable_cuda_graphs \
  activation-checkpoint:selective
