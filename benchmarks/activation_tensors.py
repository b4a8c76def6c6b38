"""What one transformer block keeps for its backward pass, tensor by tensor, at Llama 3 405B's
proportions scaled down, against the estimate.

Run from the repository root with the interpreter meshconf is installed in (needs torch)::

    python benchmarks/activation_tensors.py

The block is Llama 3 405B's shape at a sixteenth of its width (hidden 2,048, feed-forward
3.25 x hidden, 16 query heads of 128 and one key/value head, as 128 to 8), a sequence of
1,024 tokens, bf16, on CPU, with PyTorch's scaled_dot_product_attention (which keeps no score
matrix) and the rotary embedding as Llama's reference model applies it. It runs under two
norms: eager, as Hugging Face's LlamaRMSNorm and Llama's reference model write it (on an
fp32 copy of the input), and fused: one autograd function that keeps the input and the
reciprocal RMS and computes the rest again in the backward pass, as fused kernels do
(Apex's, Transformer Engine's, torch's on CUDA). That this is what torch's RMSNorm keeps
under ``torch.compile`` (as torchtitan runs it) is checked first, by the tensors the compiled
norm saves.

Three blocks run one after the other. Every tensor the middle block saves for its backward
pass is recorded once per storage (saved-tensor hooks), leaving out the weights and the
rotary table, which every block shares; torch's ``MemTracker`` measures the growth of the
activations between the ends of the first and second blocks' forward passes. Both are given
in bytes per token per hidden unit, beside the estimate's
(``meshconf.features.plan.estimate.activations.block`` with ``norm_kernel``). The results go
into docs/estimate.md ("Activations at the largest models' proportions"). Nothing here is
asserted. It takes about a minute, most of it compiling.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from harness import table
from torch import nn

from meshconf.features.plan.estimate import activations
from meshconf.features.plan.estimate.architecture import Architecture, GroupedQueryAttention

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, SEQ = 2048, 16, 1, 128, 1024
FFN = 13 * HIDDEN // 4
ARCH = Architecture(
    "llama3-405b-scaled", 1, HIDDEN, FFN, 4096, GroupedQueryAttention(HEADS, KV_HEADS, HEAD_DIM)
)


class EagerRMSNorm(nn.Module):
    """Llama's reference RMSNorm, as Hugging Face's LlamaRMSNorm also writes it."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        upcast = x.float()
        normed = upcast * torch.rsqrt(upcast.pow(2).mean(-1, keepdim=True) + 1e-5)
        return normed.type_as(x) * self.weight


class _FusedRMSNorm(torch.autograd.Function):
    """RMSNorm as one kernel computes it: keeps its input and the reciprocal RMS."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        upcast = x.float()
        rstd = torch.rsqrt(upcast.pow(2).mean(-1, keepdim=True) + 1e-5)
        ctx.save_for_backward(x, rstd, weight)
        return (upcast * rstd).type_as(x) * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, rstd, weight = ctx.saved_tensors
        normed = x.float() * rstd
        grad_normed = grad.float() * weight.float()
        mean = (grad_normed * normed).mean(-1, keepdim=True)
        grad_x = (grad_normed - normed * mean) * rstd
        grad_weight = (grad.float() * normed).flatten(0, -2).sum(0)
        return grad_x.type_as(x), grad_weight.type_as(weight)


class FusedRMSNorm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _FusedRMSNorm.apply(x, self.weight)
        return out


class Block(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        norm = FusedRMSNorm if fused else EagerRMSNorm
        self.attention_norm, self.ffn_norm = norm(HIDDEN), norm(HIDDEN)
        self.wq = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.wk = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.w1 = nn.Linear(HIDDEN, FFN, bias=False)
        self.w3 = nn.Linear(HIDDEN, FFN, bias=False)
        self.w2 = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.attention_norm(x)
        q = _rotated(self.wq(h).view(batch, seq, HEADS, HEAD_DIM), rotary)
        k = _rotated(self.wk(h).view(batch, seq, KV_HEADS, HEAD_DIM), rotary)
        v = self.wv(h).view(batch, seq, KV_HEADS, HEAD_DIM)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )
        x = x + self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def _rotated(x: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
    """Llama's reference rotary embedding: complex products on an fp32 copy."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * rotary).flatten(3).type_as(x)


def _saved(fused: bool) -> tuple[list[tuple[str, tuple[int, ...], int]], int]:
    """The tensors the middle of three blocks saves for its backward pass: the op that saved
    it, shape and bytes, one per storage; and the growth of the activations MemTracker
    measures over one block."""
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    torch.manual_seed(0)
    blocks = nn.ModuleList(Block(fused) for _ in range(3)).to(torch.bfloat16)
    rotary = torch.polar(torch.ones(SEQ, HEAD_DIM // 2), torch.randn(SEQ, HEAD_DIM // 2))
    rotary = rotary[None, :, None, :]
    x = torch.randn(1, SEQ, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    shared = {p.untyped_storage().data_ptr() for p in blocks.parameters()}
    shared.add(rotary.untyped_storage().data_ptr())
    found: dict[int, tuple[str, tuple[int, ...], int]] = {}
    recording = [False]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if recording[0] and pointer not in shared and pointer not in found:
            op = type(tensor.grad_fn).__name__ if tensor.grad_fn else "the block's input"
            found[pointer] = (op, tuple(tensor.shape), storage.nbytes())
        return tensor

    tracker = MemTracker()
    tracker.track_external(blocks)
    with tracker, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        for index, block in enumerate(blocks):
            recording[0] = index == 1
            x = block(x, rotary)
    ends = [
        _activation_bytes(stats.snapshots[_ModState.POST_FW][-1])
        for module, stats in tracker.memory_tracking.items()
        if any(module is block for block in blocks)
    ]
    return sorted(found.values(), key=lambda row: -row[2]), ends[1] - ends[0]


def _compiled_norm_saves() -> list[tuple[tuple[int, ...], torch.dtype]]:
    """What torch's RMSNorm under ``torch.compile`` saves for its backward pass."""
    norm = torch.compile(nn.RMSNorm(HIDDEN).to(torch.bfloat16))
    x = torch.randn(1, SEQ, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    saved: list[tuple[tuple[int, ...], torch.dtype]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append((tuple(tensor.shape), tensor.dtype))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        norm(x)
    return saved


def _activation_bytes(snapshot: dict[Any, dict[Any, int]]) -> int:
    return sum(
        size
        for sizes in snapshot.values()
        for kind, size in sizes.items()
        if getattr(kind, "name", "") in ("ACT", "TEMP")
    )


def main() -> None:
    unit = SEQ * HIDDEN
    print("# One block at Llama 3 405B's proportions, tensor by tensor\n")
    print("Command: `python benchmarks/activation_tensors.py`\n")
    compiled = ", ".join(f"{list(shape)} {dtype}" for shape, dtype in _compiled_norm_saves())
    print(f"torch's RMSNorm under torch.compile saves: {compiled}\n")
    totals = []
    for fused, kernel in ((False, "eager"), (True, "fused")):
        saved, grown = _saved(fused)
        print(f"## {kernel} norms\n")
        rows = [[op, str(shape), f"{size / unit:.3f}"] for op, shape, size in saved]
        print(table(["saved by", "shape", "bytes / (token x hidden)"], rows, right=(2,)))
        estimate = activations.block(ARCH, "dense", "none", norm_kernel=kernel).bytes(SEQ, 1, 2)
        total = sum(size for _, _, size in saved)
        totals.append([kernel, *(f"{size / unit:.2f}" for size in (total, grown, estimate))])
        print()
    headers = ["norms", "saved tensors", "MemTracker growth", "estimate"]
    print("## Totals, bytes per token per hidden unit\n")
    print(table(headers, totals, right=(1, 2, 3)))


if __name__ == "__main__":
    main()
