"""The simulated target-verify CUDA-graph replay (SGLang SIMULATOR, a test double).

The functions are named after the SGLang call chain that fails in a DDTree build whose
verify graphs were captured at ``block_size`` tokens per request while the tree verify
forward needs ``budget + 1`` -- so the traceback a test or an operator sees reads like
the real scheduler crash and ends in the same line::

    RuntimeError: The size of tensor a (8) must match the size of tensor b (33) at non-singleton dimension 0

``a`` is the captured buffer (padded batch size x captured width), ``b`` the batch's
tokens (batch size x width the verify forward needs).
"""

from __future__ import annotations


class CudaGraphRunner:
    """Stand-in for sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner."""

    def __init__(self, captured_tokens_per_req: int) -> None:
        self.num_tokens_per_bs = captured_tokens_per_req

    def replay_prepare(self, raw_bs: int, padded_bs: int, tokens_per_req: int) -> None:
        captured_numel = padded_bs * self.num_tokens_per_bs
        needed_numel = raw_bs * tokens_per_req
        if captured_numel != needed_numel and self.num_tokens_per_bs != tokens_per_req:
            # what torch says when copying custom_mask/positions into the static buffers
            raise RuntimeError(
                f"The size of tensor a ({captured_numel}) must match the size of tensor b "
                f"({needed_numel}) at non-singleton dimension 0"
            )
        if self.num_tokens_per_bs != tokens_per_req:
            raise RuntimeError(
                f"The size of tensor a ({self.num_tokens_per_bs}) must match the size of tensor b "
                f"({tokens_per_req}) at non-singleton dimension 1"
            )

    def replay(self, raw_bs: int, padded_bs: int, tokens_per_req: int) -> None:
        self.replay_prepare(raw_bs, padded_bs, tokens_per_req)


class ModelRunner:
    def __init__(self, graph_runner: CudaGraphRunner) -> None:
        self.graph_runner = graph_runner

    def forward(self, raw_bs: int, padded_bs: int, tokens_per_req: int) -> None:
        self.graph_runner.replay(raw_bs, padded_bs, tokens_per_req)


class DDTreeWorker:
    """Stand-in for the speculative worker's verify step (DFlash/DDTree/EAGLE alike)."""

    def __init__(self, model_runner: ModelRunner) -> None:
        self.target_worker_model_runner = model_runner

    def verify(self, raw_bs: int, padded_bs: int, tokens_per_req: int) -> None:
        self.target_worker_model_runner.forward(raw_bs, padded_bs, tokens_per_req)

    def forward_batch_generation(self, raw_bs: int, padded_bs: int, tokens_per_req: int) -> None:
        self.verify(raw_bs, padded_bs, tokens_per_req)


def run_batch(captured_tokens_per_req: int, raw_bs: int, padded_bs: int, tokens_per_req: int) -> None:
    """Replay a verify graph; raises RuntimeError when the widths disagree."""
    worker = DDTreeWorker(ModelRunner(CudaGraphRunner(captured_tokens_per_req)))
    worker.forward_batch_generation(raw_bs, padded_bs, tokens_per_req)
