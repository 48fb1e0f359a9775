import torch

from train.config import load_config
from train.models.llama import Transformer, count_params, flops_per_token


def _model(name="tiny", seed=0):
    cfg = load_config(name).model
    with torch.device("meta"):
        m = Transformer(cfg)
    m.to_empty(device="cpu")
    m.init_weights(seed)
    return m, cfg


def test_forward_shape_and_causality():
    m, cfg = _model()
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    y = m(x)
    assert y.shape == (2, 16, cfg.vocab_size)
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % cfg.vocab_size  # change the future
    assert torch.equal(m(x2)[:, :10], y[:, :10])  # the past does not see it


def test_init_is_deterministic_from_seed():
    a, _ = _model(seed=7)
    b, _ = _model(seed=7)
    c, _ = _model(seed=8)
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), n
    assert not torch.equal(a.layers["0"].attention.wq.weight, c.layers["0"].attention.wq.weight)


def test_gqa_shapes_and_flops_formula_counts_params():
    cfg = load_config("tiny", ["model.n_kv_heads=2"]).model
    m = Transformer(cfg)
    assert m.layers["0"].attention.wk.weight.shape == (2 * cfg.head_dim, cfg.dim)
    n = count_params(m, exclude_embedding=True)
    assert flops_per_token(cfg, 64) == 6 * n + 12 * cfg.n_layers * cfg.dim * 64
