"""torchtitan's parallel degrees, meshconf's one for one: the fields of its ``[parallelism]``
table (its ``ParallelismConfig``) that are mesh settings, read by ``meshconf convert --from
torchtitan`` and by ``ParallelDims.from_config`` of :mod:`meshconf.compat.torchtitan`."""

#: The fields that are mesh settings, and the meshconf degree each one is; torchtitan 0.3
#: has no expert tensor parallelism.
TORCHTITAN_DEGREES = {
    "pipeline_parallel_degree": "pp",
    "data_parallel_replicate_degree": "dp_replicate",
    "data_parallel_shard_degree": "dp_shard",
    "context_parallel_degree": "cp",
    "tensor_parallel_degree": "tp",
    "expert_parallel_degree": "ep",
    "expert_tensor_parallel_degree": "etp",
}
