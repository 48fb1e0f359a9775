"""Top-K sparsification with error feedback: the selection, the residual, the packing of
the exchange, and what error feedback buys over steps. (The exchange through DDP across
2 processes is checked in test_comm_training.py.)"""

import torch

from testlib import topk_dense
from train.comm.topk import pack, select_topk, unpack_sum


def test_select_topk_and_residual():
    g = torch.Generator().manual_seed(0)
    grad, residual = torch.randn(1000, generator=g), torch.randn(1000, generator=g) * 0.1
    values, indices, new_residual = select_topk(grad.clone(), residual, 10)
    acc = grad + residual
    assert set(indices.tolist()) == set(acc.abs().topk(10).indices.tolist())
    torch.testing.assert_close(values, acc[indices], rtol=0, atol=0)
    sent = torch.zeros(1000)
    sent[indices] = values
    torch.testing.assert_close(new_residual, acc - sent, rtol=0, atol=0)  # nothing lost, nothing invented
    assert (new_residual[indices] == 0).all()


def test_pack_unpack_sums_ranks():
    a_v, a_i = torch.tensor([1.0, -2.0]), torch.tensor([3, 7])
    b_v, b_i = torch.tensor([0.5, 4.0]), torch.tensor([7, 0])
    gathered = torch.cat([pack(a_v, a_i), pack(b_v, b_i)])
    out = unpack_sum(gathered, 2, 2, torch.float32, 10)
    expect = torch.zeros(10)
    expect[[3, 7]] += a_v
    expect[[7, 0]] += b_v
    torch.testing.assert_close(out, expect, rtol=0, atol=0)
    # bf16 values with an odd k: index bytes start at unaligned offsets in the gathered rows
    v3, i3 = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16), torch.tensor([0, 4, 9])
    gathered = torch.cat([pack(v3, i3), pack(v3 * 2, i3.flip(0))])
    out = unpack_sum(gathered, 2, 3, torch.bfloat16, 10)
    assert out[[0, 4, 9]].tolist() == [7.0, 6.0, 5.0] and out.sum().item() == 18.0


def test_error_feedback_sum_of_updates_approaches_uncompressed_sum():
    g = torch.Generator().manual_seed(1)
    mean = torch.randn(2000, generator=g)  # a persistent direction plus noise, like real gradients
    k, steps = 20, 400  # 1%
    residual = torch.zeros(2000)
    total, sent_ef, sent_plain = torch.zeros(2000), torch.zeros(2000), torch.zeros(2000)
    errors = []
    for t in range(steps):
        grad = mean + torch.randn(2000, generator=g)
        total += grad
        values, indices, residual = select_topk(grad, residual, k)
        sent_ef[indices] += values
        sent_plain += topk_dense(grad, k)
        errors.append(((total - sent_ef).norm() / total.norm()).item())
    torch.testing.assert_close(sent_ef + residual, total, rtol=1e-4, atol=1e-3)  # exactly delayed, never lost
    ef_err = errors[-1]
    plain_err = ((total - sent_plain).norm() / total.norm()).item()
    assert ef_err < 0.5 * errors[len(errors) // 4], errors[::50]  # keeps shrinking with more steps
    assert ef_err < 0.25 * plain_err, (ef_err, plain_err)  # without feedback most of the signal is lost
