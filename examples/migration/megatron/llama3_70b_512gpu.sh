#!/bin/bash
# Llama 3 70B on 64 nodes of 8 GPUs with Megatron-LM: TP 8, PP 4, and the distributed
# optimizer in 2 instances over the 16 data-parallel ranks.
# `meshconf convert --from megatron examples/migration/megatron/llama3_70b_512gpu.sh`
# turns it into examples/migration/from_megatron.yaml.

GPUS_PER_NODE=8
NUM_NODES=64

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
    --master_port 6000
)

MODEL_ARGS=(
    --num-layers 80
    --hidden-size 8192
    --num-attention-heads 64
    --seq-length 8192
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 4
    --use-distributed-optimizer
    --num-distributed-optimizer-instances 2
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    --micro-batch-size 1 \
    --global-batch-size 512 \
    --sequence-parallel
