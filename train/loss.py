"""The training loss: next-token cross-entropy over the vocabulary (``train.loss``).

Three ways to compute the same number (and the same gradients); ``auto`` (the default) is
``compiled`` on CUDA and ``eager`` elsewhere (a CPU run does not pay a compile for it):

* ``eager``: ``F.cross_entropy(logits.float())``. The model returns the full
  ``[tokens, vocab]`` logits; the fp32 copy, its log-softmax and their gradients are all
  materialised (at 1b, 8x2048 tokens x 32,768 vocabulary: 2 GiB per fp32 copy).
* ``compiled``: the same cross-entropy through ``torch.compile``, on the logits as the
  model returns them (bf16 under autocast); the upcast happens inside the compiled
  kernels, so no fp32 logits tensor is ever allocated.
* ``chunked``: the output projection and the cross-entropy fused over chunks of
  ``train.loss_chunk_tokens`` tokens (:class:`ChunkedCrossEntropy`): the full logits never
  exist. Each chunk's logits, loss and gradients (with respect to the final hidden states
  and the output weight) are computed in the forward pass; backward only scales the
  stored gradients by the incoming gradient. On CUDA the per-chunk math is compiled.

The model does not know about any of this: for ``chunked`` the trainer installs a loss
head on the bare model (``Transformer.loss_head``) and calls ``model(inputs, targets)``;
the output module calls it as ``head(h, self.weight, targets)`` (``Output.forward(h,
targets)``), so the output projection's FSDP2 unit unshards, reshards and reduce-scatters
its weight exactly as for ``self.output(h)``. ``chunked`` is refused
with tensor parallelism (a vocabulary-sharded output weight needs a distributed
log-sum-exp), see ``train.config.JobConfig.validate``.

Targets equal to ``IGNORE_INDEX`` (-100, ``F.cross_entropy``'s default) are left out of
the mean in every mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from train.compat import mm_fp32_out
from train.config import LOSS_MODES  # noqa: F401 - the valid train.loss values

IGNORE_INDEX = -100

# torch.compile backend of the compiled paths (tests may use "aot_eager": no C++ toolchain).
COMPILE_BACKEND = "inductor"
_compiled: dict = {}


def _compile(fn):
    key = (fn.__name__, COMPILE_BACKEND)
    if key not in _compiled:
        _compiled[key] = torch.compile(fn, backend=COMPILE_BACKEND, fullgraph=True, dynamic=False)
    return _compiled[key]


def _cross_entropy_upcast(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=IGNORE_INDEX)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mode: str = "eager") -> torch.Tensor:
    """Mean cross-entropy of ``logits`` [..., vocab] against ``targets`` [...]."""
    if mode == "auto":
        mode = "compiled" if logits.is_cuda else "eager"
    if mode == "compiled" and not hasattr(logits, "full_tensor"):  # DTensor (loss_parallel): eager
        return _compile(_cross_entropy_upcast)(logits, targets)
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)


# ----------------------------------------------------------------------------- chunked
def _chunk_math(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor):
    """One chunk: summed loss, its gradient w.r.t. ``x`` and w.r.t. the chunk's logits.

    x: [n, dim] and w: [vocab, dim] in the compute dtype; t: [n] targets. The softmax is
    taken in fp32; the gradient of the logits is cast back to the compute dtype for the
    matmuls, as autocast's backward would. The caller turns the logits' gradient into the
    weight's (:func:`_accumulate_grad_w`), accumulating over chunks in fp32."""
    logits = (x @ w.t()).float()
    lse = torch.logsumexp(logits, dim=-1)
    valid = t != IGNORE_INDEX
    safe = torch.where(valid, t, torch.zeros_like(t))
    picked = logits.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
    probs = torch.exp(logits - lse[:, None])
    cols = torch.arange(logits.shape[1], device=logits.device)
    grad = torch.where(cols[None, :] == safe[:, None], probs - 1.0, probs)
    grad = torch.where(valid[:, None], grad, torch.zeros_like(grad)).to(x.dtype)
    return loss, grad @ w, grad


# On CUDA, bf16/fp16 matmuls with an fp32 output (``out_dtype``) accumulated into it by cuBLAS
# (beta=1): no separate add of a [vocab, dim] fp32 tensor per chunk (train.compat.mm_fp32_out).
_MM_FP32_OUT = mm_fp32_out(torch.__version__)


def _accumulate_grad_w(grad_w: torch.Tensor | None, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``grad_w + grad.T @ x`` in fp32 (``grad_w`` None: the first chunk's product)."""
    if _MM_FP32_OUT and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):
        if grad_w is None:
            return torch.mm(grad.t(), x, out_dtype=torch.float32)
        return torch.addmm(grad_w, grad.t(), x, out_dtype=torch.float32, out=grad_w)
    part = (grad.t() @ x).float()  # rounded to the compute dtype first, as a plain matmul is
    if grad_w is None:
        return part
    return grad_w.add_(part)


class ChunkedCrossEntropy(torch.autograd.Function):
    """``cross_entropy(h @ weight.T, targets)`` without the full logits.

    Forward walks the tokens in chunks, keeping the summed loss, ``grad_h`` ([tokens, dim],
    ``h``'s dtype) and ``grad_weight`` (fp32 accumulator, stored in ``weight``'s dtype) of the
    summed loss; the mean divides by the number of non-ignored targets. Backward returns
    them scaled by ``grad_output / count``."""

    @staticmethod
    def forward(ctx, h, weight, targets, chunk: int, compute_dtype: torch.dtype, compiled: bool):
        flat = h.reshape(-1, h.shape[-1])
        t = targets.reshape(-1)
        x, w = flat.to(compute_dtype), weight.to(compute_dtype)
        step = _compile(_chunk_math) if compiled else _chunk_math
        grad_h = torch.empty_like(flat)
        grad_w = None  # fp32 [vocab, dim]
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        with torch.autocast(h.device.type, enabled=False):
            for start in range(0, flat.shape[0], chunk):
                end = min(start + chunk, flat.shape[0])
                part_loss, part_gh, part_grad = step(x[start:end], w, t[start:end])
                loss += part_loss
                grad_h[start:end] = part_gh
                grad_w = _accumulate_grad_w(grad_w, part_grad, x[start:end])
                del part_grad
        count = (t != IGNORE_INDEX).sum().to(torch.float32)
        ctx.h_shape = h.shape
        if grad_w is None:  # no tokens
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype), count)
        return loss / count

    @staticmethod
    def backward(ctx, grad_output):
        grad_h, grad_w, count = ctx.saved_tensors
        scale = grad_output.to(torch.float32) / count
        # In place: the saved gradients are this function's alone and read once (no second
        # backward through it), so scaling them needs no second copy at backward's start.
        dh = grad_h.mul_(scale.to(grad_h.dtype)).view(ctx.h_shape)
        dw = grad_w.mul_(scale.to(grad_w.dtype))
        return dh, dw, None, None, None, None


class ChunkedLossHead:
    """Installed as ``Transformer.loss_head``: called with ``(h, output_weight, targets)``."""

    def __init__(self, chunk_tokens: int, compiled: bool | None = None):
        self.chunk_tokens = chunk_tokens
        self.compiled = compiled  # None: compile the per-chunk math on CUDA only

    def __call__(self, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        device_type = h.device.type
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
        else:
            dtype = weight.dtype
        compiled = device_type == "cuda" if self.compiled is None else self.compiled
        return ChunkedCrossEntropy.apply(h, weight, targets, self.chunk_tokens, dtype, compiled)


# ----------------------------------------------------------------------------- trainer glue
def head_args(par, train_cfg, targets: torch.Tensor) -> tuple:
    """Extra positional arguments of the model call: ``(targets,)`` for ``chunked`` (the
    model then returns the loss; the head is installed on ``par.inner`` once), else ()."""
    if train_cfg.loss != "chunked":
        return ()
    head = getattr(par.inner, "loss_head", None)
    if not isinstance(head, ChunkedLossHead) or head.chunk_tokens != train_cfg.loss_chunk_tokens:
        par.inner.loss_head = ChunkedLossHead(train_cfg.loss_chunk_tokens)
    return (targets,)


def loss_from(out: torch.Tensor, targets: torch.Tensor, train_cfg) -> torch.Tensor:
    """The mean loss from what the model returned (logits, or the loss itself for chunked)."""
    if train_cfg.loss == "chunked":
        return out
    return cross_entropy(out, targets, train_cfg.loss)
