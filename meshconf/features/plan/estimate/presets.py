"""Published architectures, by the name ``--model`` takes.

Sources: the ``config.json`` of each model's release (Meta's Llama 3.1 8B, 70B and 405B;
DeepSeek-V3; Mistral's Mixtral-8x7B-v0.1; Qwen3-30B-A3B) and the DeepSeek-V3 technical report
(arXiv:2412.19437, section 4.2). The multi-token-prediction module of DeepSeek-V3 is left out:
it is an extra training objective, not part of the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from meshconf.features.plan.estimate.architecture import (
    Architecture,
    Experts,
    GroupedQueryAttention,
    LatentAttention,
)

_LLAMA3_VOCAB = 128256

PRESETS: Mapping[str, Architecture] = MappingProxyType(
    {
        "llama3-8b": Architecture(
            "llama3-8b", 32, 4096, 14336, _LLAMA3_VOCAB, GroupedQueryAttention(32, 8, 128)
        ),
        "llama3-70b": Architecture(
            "llama3-70b", 80, 8192, 28672, _LLAMA3_VOCAB, GroupedQueryAttention(64, 8, 128)
        ),
        "llama3-405b": Architecture(
            "llama3-405b", 126, 16384, 53248, _LLAMA3_VOCAB, GroupedQueryAttention(128, 8, 128)
        ),
        "deepseek-v3": Architecture(
            "deepseek-v3",
            61,
            7168,
            18432,
            129280,
            LatentAttention(128, 1536, 512, 128, 64, 128),
            Experts(routed=256, top_k=8, ffn=2048, shared=1, dense_layers=3),
        ),
        "mixtral-8x7b": Architecture(
            "mixtral-8x7b",
            32,
            4096,
            14336,
            32000,
            GroupedQueryAttention(32, 8, 128),
            Experts(routed=8, top_k=2, ffn=14336),
        ),
        "qwen3-30b-a3b": Architecture(
            "qwen3-30b-a3b",
            48,
            2048,
            6144,
            151936,
            GroupedQueryAttention(32, 4, 128, qk_norm=True),
            Experts(routed=128, top_k=8, ffn=768),
        ),
    }
)
