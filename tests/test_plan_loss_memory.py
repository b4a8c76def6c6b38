"""The loss term of the estimate against torch's own memory tracker.

torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``) follows every tensor's
storage, by kind (parameter, activation, temporary), through a forward and backward pass. Run
under ``FakeTensorMode``, the tensors have shapes and no data, so a loss over 8,192 tokens and
a 152,064-word vocabulary (a Qwen-sized head) costs nothing to measure. The loss is
torchtitan's: ``cross_entropy`` on the logits cast to fp32, the logits deleted before
``backward``. Its peak, less the head's weights and input, must equal the estimator's loss
term (``output_head`` without the final norm) within 1%.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from meshconf.features.plan.estimate.activations import LOSS_FP32_COPIES, PerToken


def _measured_loss_peak(tokens: int, hidden: int, vocab: int, dtype: torch.dtype) -> int:
    """Peak bytes of the loss's forward and backward, over the head's weights and input."""
    with FakeTensorMode():
        head = torch.nn.Linear(hidden, vocab, bias=False, dtype=dtype)
        hidden_states = torch.randn(tokens, hidden, dtype=dtype, requires_grad=True)
        labels = torch.randint(0, vocab, (tokens,))
        tracker = MemTracker()
        tracker.track_external(head, hidden_states)
        with tracker:
            pred = head(hidden_states)
            loss = F.cross_entropy(pred.float(), labels)
            del pred  # as torchtitan's train step does before backward
            loss.backward()
        (peak,) = tracker.get_tracker_snapshot("peak").values()
    element = torch.finfo(dtype).bits // 8
    inputs = (hidden * vocab + tokens * hidden) * element
    total = next(value for key, value in peak.items() if str(key) == "Total")
    return int(total) - inputs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("tokens", "vocab"), [(8192, 152_064), (4096, 128_256), (1024, 32_000)])
def test_the_loss_term_is_the_measured_peak(tokens: int, vocab: int, dtype: torch.dtype) -> None:
    measured = _measured_loss_peak(tokens, 1024, vocab, dtype)
    estimated = PerToken(fp32=LOSS_FP32_COPIES * vocab).bytes(tokens, 1, 2)
    assert estimated == pytest.approx(measured, rel=0.01), (estimated, measured)
