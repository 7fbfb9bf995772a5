#!/usr/bin/env bash
# torchtitan 0.3 launch written by pase: runs the plan dp=4,tp=1,cp=2,zero=2,recompute=none,microbatch=1
# torchtitan 0.3.0: torchrun -m torchtitan.train, parsed by its ConfigManager
# (--module, --config, then Trainer.Config's fields, the activation-checkpoint subcommand last)
# model: torchtitan's llama3 8B (Llama 3.1: 32 layers, width 4096, 32 heads), its config function llama3_8b
# CUDA graphs off (--training.disable_cuda_graphs): the step is priced with eager kernel launches
set -euo pipefail
torchrun --nnodes 1 --nproc-per-node 8 -m torchtitan.train \
  --module llama3 --config llama3_8b \
  --parallelism.data_parallel_replicate_degree 1 \
  --parallelism.data_parallel_shard_degree 4 \
  --parallelism.tensor_parallel_degree 1 \
  --parallelism.pipeline_parallel_degree 1 \
  --parallelism.context_parallel_degree 2 \
  --parallelism.expert_parallel_degree 1 \
  --parallelism.fsdp_reshard_after_forward never \
  --training.local_batch_size 1 \
  --training.global_batch_size 16 \
  --training.seq_len 8192 \
  --training.disable_cuda_graphs \
  activation-checkpoint:none
