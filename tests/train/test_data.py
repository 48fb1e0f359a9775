import numpy as np
import pytest

from train.config import load_config
from train.data import ShardInfo, build_loader, write_token_file
from train.errors import DataError


def _loader(rank, world, **kw):
    job = load_config("tiny", [f"{k}={v}" for k, v in kw.items()])
    return build_loader(job.data, job.train.seq_len, job.train.batch_size, ShardInfo(rank, world),
                        job.train.seed, job.model.vocab_size)


def test_embedded_corpus_is_real_text():
    x, y = _loader(0, 1).next_batch()
    assert x.shape == y.shape == (16, 128)
    assert np.array_equal(x[:, 1:].numpy(), y[:, :-1].numpy())
    text = bytes(x.flatten().tolist()).decode("utf-8", errors="replace")
    assert any(word in text for word in ("def ", "import ", "return", "self")), text[:200]


def test_rank_shards_are_disjoint_and_cover_the_epoch_prefix():
    loaders = [_loader(r, 2) for r in range(2)]
    seen = [set(), set()]
    for _ in range(5):
        for r, ld in enumerate(loaders):
            seen[r].update(ld.window_ids(ld.batch_size))
            ld.next_batch()
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(2 * 5 * 16))


def test_position_resumes_exactly():
    a = _loader(1, 2)
    for _ in range(3):
        a.next_batch()
    state = a.state_dict()
    expected = a.next_batch()[0]
    b = _loader(1, 2)
    b.load_state_dict(state)
    assert np.array_equal(b.next_batch()[0].numpy(), expected.numpy())


def test_user_token_file_and_truncation(tmp_path):
    path = tmp_path / "toks.bin"
    write_token_file(path, np.arange(100_000) % 500, vocab_size=500)
    ld = _loader(0, 1, **{"data.source": "file", "data.path": str(path), "model.vocab_size": 512})
    x, _ = ld.next_batch()
    assert int(x.max()) < 500
    with open(path, "ab") as fh:
        fh.write(b"\x01")  # odd byte count: truncated uint16 stream
    with pytest.raises(DataError, match="truncated"):
        _loader(0, 1, **{"data.source": "file", "data.path": str(path), "model.vocab_size": 512})
    with pytest.raises(DataError, match="does not exist"):
        _loader(0, 1, **{"data.source": "file", "data.path": str(tmp_path / "nope.bin")})


def test_vocab_larger_than_model_is_rejected(tmp_path):
    path = tmp_path / "big.bin"
    write_token_file(path, np.arange(10_000) % 1000, vocab_size=1000)
    with pytest.raises(DataError, match="model.vocab_size"):
        _loader(0, 1, **{"data.source": "file", "data.path": str(path)})
