"""A whole Mixture-of-Experts layer on torch tensors, trained through moe_permute/unpermute.

router -> moe_permute -> experts (each multiplies its output rows by their routing
probability) -> moe_unpermute (unweighted). The layer's output and every gradient (input,
router, experts) equal a dense reference made of plain torch ops; a few optimiser steps
lower the loss. Then the same layer compiled with ``torch.compile(fullgraph=True)``, and on a
CUDA GPU its forward and backward captured in one CUDA graph.

Runs on the CPU (``python docs/examples/moe_layer.py``); needs PyTorch.
"""

from moe_numba import moe_permute, moe_unpermute

try:
    import torch
except ImportError:  # skip_reason() says so, and nothing below runs
    torch = None


def skip_reason():
    """Why this example cannot run here, or None."""
    return "needs PyTorch" if torch is None else None


# [start-layer]


class MoELayer:
    """Top-k routing over ``num_experts`` two-layer MLPs (a torch.nn.Module in a model)."""

    def __init__(self, hidden, ffn, num_experts, topk, alignment, device="cpu"):
        self.num_experts, self.topk, self.alignment = num_experts, topk, alignment

        def weight(*shape):
            return (torch.randn(*shape, device=device) * shape[-2] ** -0.5).requires_grad_()

        self.router = weight(hidden, num_experts)
        self.w_in = weight(num_experts, hidden, ffn)
        self.w_out = weight(num_experts, ffn, hidden)

    def parameters(self):
        return [self.router, self.w_in, self.w_out]

    def route(self, x):
        """Top-k experts of every token (int32) and their probabilities."""
        probs, experts = torch.topk((x @ self.router).softmax(dim=-1), self.topk, dim=-1)
        return experts.to(torch.int32), probs

    def expert(self, e, rows):
        return torch.nn.functional.gelu(rows @ self.w_in[e]) @ self.w_out[e]

    def __call__(self, x):
        routemap, probs = self.route(x)
        # a host list of rows per expert (a small device-to-host copy on a GPU)
        tokens_per_expert = torch.bincount(
            routemap.flatten().long(), minlength=self.num_experts
        ).tolist()
        rows, rowmap, row_probs, _ = moe_permute(
            x, None, routemap, probs, self.num_experts, tokens_per_expert, self.alignment
        )
        # expert e owns the next ceil(n_e / A) * A rows; padding rows are zero
        outputs, start = [], 0
        for e, n in enumerate(tokens_per_expert):
            end = start + -(-n // self.alignment) * self.alignment
            outputs.append(self.expert(e, rows[start:end]))
            start = end
        # the probability applied inside the expert: its gradient reaches the router through
        # moe_permute's row probabilities
        expert_rows = torch.cat(outputs) * row_probs[:, None]
        out, _ = moe_unpermute(
            expert_rows, rowmap, routemap, row_probs, x.shape[0], self.num_experts
        )
        return out


# [end-layer]


def dense_reference(layer, x):
    """The same layer without moe-numba: every token through each of its top-k experts."""
    routemap, probs = layer.route(x)
    out = torch.zeros_like(x)
    for e in range(layer.num_experts):
        weight = (probs * (routemap == e)).sum(dim=1, keepdim=True)  # 0 for other tokens
        out = out + layer.expert(e, x) * weight
    return out


def check_against_the_reference():
    # [start-check]
    torch.manual_seed(0)
    layer = MoELayer(hidden=16, ffn=32, num_experts=4, topk=2, alignment=4)
    x = torch.randn(32, 16, requires_grad=True)
    target = torch.randn(32, 16)

    loss = ((layer(x) - target) ** 2).mean()
    grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    reference_loss = ((dense_reference(layer, x) - target) ** 2).mean()
    reference_grads = torch.autograd.grad(reference_loss, [x, *layer.parameters()])
    torch.testing.assert_close(loss, reference_loss)
    for grad, reference in zip(grads, reference_grads, strict=True):
        torch.testing.assert_close(grad, reference, rtol=1e-4, atol=1e-6)
    # [end-check]
    return layer, x.detach(), target


def train(layer, x, target, steps=20):
    # [start-train]
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((layer(x) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # [end-train]
    assert losses[-1] < 0.9 * losses[0], losses


# [start-compile]
def compilable_forward(layer, x, validate=True):
    """The layer with no host round trip: a fixed row count (override_buffer_size) that any
    routing fits in, and the owning expert of every row from return_expert_indices.
    ``validate=False`` also drops the value checks' device-to-host read."""
    num_tokens = x.shape[0]
    routemap, probs = layer.route(x)
    rows, rowmap, row_probs, _, expert_of_row = moe_permute(
        x,
        None,
        routemap,
        probs,
        layer.num_experts,
        None,
        layer.alignment,
        return_expert_indices=True,
        override_buffer_size=num_tokens * layer.topk + layer.num_experts * (layer.alignment - 1),
        validate=validate,
    )
    expert_rows = torch.zeros_like(rows)
    for e in range(layer.num_experts):  # a grouped GEMM does this in one call
        mine = (expert_of_row == e)[:, None]
        expert_rows = torch.where(mine, layer.expert(e, rows), expert_rows)
    out, _ = moe_unpermute(
        expert_rows * row_probs[:, None],
        rowmap,
        routemap,
        row_probs,
        num_tokens,
        layer.num_experts,
        validate=validate,
    )
    return out


# [end-compile]


def check_compiled(layer, x, target):
    # [start-compiled-step]
    compiled = torch.compile(compilable_forward, fullgraph=True)
    loss = ((compiled(layer, x) - target) ** 2).mean()
    grads = torch.autograd.grad(loss, layer.parameters())  # a compiled backward
    # [end-compiled-step]
    eager_loss = ((layer(x) - target) ** 2).mean()
    eager_grads = torch.autograd.grad(eager_loss, layer.parameters())
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    for grad, eager in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(grad, eager, rtol=1e-4, atol=1e-6)


def check_cuda_graph():
    """One training step's forward and backward in a CUDA graph, replayed on new batches."""
    torch.manual_seed(1)
    layer = MoELayer(hidden=64, ffn=128, num_experts=8, topk=2, alignment=16, device="cuda")
    # [start-cuda-graph]
    # static inputs: every replay reads these tensors, so new batches are copied into them
    x = torch.randn(256, 64, device="cuda")
    target = torch.randn(256, 64, device="cuda")

    def step():
        loss = ((compilable_forward(layer, x, validate=False) - target) ** 2).mean()
        return torch.autograd.grad(loss, layer.parameters())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()

    x.copy_(torch.randn_like(x))  # a new batch
    graph.replay()  # grads now hold this batch's gradients
    # [end-cuda-graph]
    expected = step()
    for replayed, eager in zip(grads, expected, strict=True):
        torch.testing.assert_close(replayed, eager)


def main():
    layer, x, target = check_against_the_reference()
    train(layer, x, target)
    check_compiled(layer, x, target)
    if torch.cuda.is_available():
        check_cuda_graph()


if __name__ == "__main__":
    reason = skip_reason()
    if reason:
        print(f"skipped: {reason}")
    else:
        main()
