"""``--tokenizer``: a ``tokenizer.json``, a directory holding one, or a Hub name (through
``transformers.AutoTokenizer`` when installed, else ``huggingface_hub``), resolved to a fast
(Rust) tokenizer, serialised for the worker processes, with its EOS token."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from core.safety import excerpt, file_kind, parse_json, probe_path
from train.errors import PrepareError

MAX_VOCAB = 1 << 32  # ids a uint32 token file holds
EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "[SEP]")


@dataclass
class TokenizerSpec:
    name: str
    json: str  # the fast tokenizer, serialised (what workers load)
    sha256: str
    vocab_size: int
    eos_id: int | None


def _eos_from_config(directory: Path) -> str | None:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        f = directory / name
        if f.is_file():
            try:
                eos = parse_json(f.read_text()).get("eos_token")
            except (ValueError, AttributeError):
                continue
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str):
                return eos
    return None


def load_tokenizer(name: str, online: bool = False, eos: str | None = None) -> TokenizerSpec:
    """Resolve ``name`` to a fast tokenizer; raises PrepareError naming it."""
    path = Path(name)
    eos_text = None
    st = probe_path(path, "--tokenizer")  # a name too long: one line, not an OSError from is_file()
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise PrepareError(f"--tokenizer {excerpt(name)}: is {file_kind(st.st_mode)}; give a tokenizer.json, "
                           "a directory holding one, or a Hugging Face name")
    if st is not None and stat.S_ISREG(st.st_mode):
        tok = _from_file(path, name)
        eos_text = _eos_from_config(path.parent)
    elif st is not None and (path / "tokenizer.json").is_file():
        tok = _from_file(path / "tokenizer.json", name)
        eos_text = _eos_from_config(path)
    else:
        tok, eos_text = _hub_tokenizer(name, online, local_dir=st is not None)
    eos_text = eos or eos_text
    eos_id = None
    if eos_text is not None:
        eos_id = tok.token_to_id(eos_text)
        if eos_id is None:
            raise PrepareError(f"--eos {excerpt(eos_text)}: not a token of tokenizer {excerpt(name)}")
    else:
        eos_id = next((tok.token_to_id(t) for t in EOS_NAMES if tok.token_to_id(t) is not None), None)
    text = tok.to_str()
    return TokenizerSpec(name, text, hashlib.sha256(text.encode()).hexdigest(), vocab_size(tok, name, eos_id), eos_id)


def vocab_size(tok, name: str, eos_id: int | None) -> int:
    """One more than the largest id the tokenizer can produce: its vocabulary's largest id
    (a WordLevel/BPE vocabulary may have gaps, so not ``get_vocab_size()``), the EOS id.
    Ids beyond 2**32 - 1 fit no token file: refused, naming --tokenizer."""
    ids = list(tok.get_vocab(with_added_tokens=True).values())
    if not ids:
        raise PrepareError(f"--tokenizer {excerpt(name)}: has an empty vocabulary (or one the tokenizers "
                           "library could not read)")
    top = max([*ids, tok.get_vocab_size(with_added_tokens=True) - 1, -1 if eos_id is None else eos_id])
    if min(ids, default=0) < 0 or top >= MAX_VOCAB:
        raise PrepareError(f"--tokenizer {excerpt(name)}: has token id {top if top >= MAX_VOCAB else min(ids)}; "
                           f"a token file holds ids 0..{MAX_VOCAB - 1}")
    return top + 1


def _from_file(path: Path, name: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure is the file's fault
        detail = " ".join(str(exc).split())[:160]
        raise PrepareError(f"--tokenizer {excerpt(name)}: {excerpt(path.name)} is not a tokenizer.json file ({detail})") from None


def _hub_tokenizer(name: str, online: bool, local_dir: bool = False):
    """A Hub name (or a local directory without tokenizer.json, which transformers may still
    load), via transformers.AutoTokenizer when installed, else huggingface_hub."""
    where = "the Hugging Face cache" if not online else "the Hugging Face Hub"
    hint = "" if online else " (offline by default: pass --online to download it)"
    if local_dir:
        where, hint = "that directory", " (it holds no tokenizer.json)"
    name_text = excerpt(name)
    if os.sep in name and not local_dir and name.startswith((".", "/")):
        raise PrepareError(f"--tokenizer {name_text}: no such file or directory")
    down = None
    if online and not local_dir:
        from train.prepare.hub import unreachable

        down = unreachable()
        online = online and down is None  # no network: the local cache only (no half a minute of retries)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None  # noqa: N806
    if AutoTokenizer is not None:
        try:
            hf = AutoTokenizer.from_pretrained(name, local_files_only=not online)
        except Exception as exc:  # noqa: BLE001 - transformers raises OSError/ValueError/...
            raise _lookup_error(f"--tokenizer {name_text}", f"not found in {where}{hint}", exc, online, down) from None
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise PrepareError(f"--tokenizer {name_text}: has no fast (Rust) tokenizer; save it with tokenizer.json")
        return backend, hf.eos_token
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:
        raise PrepareError(f"--tokenizer {name_text}: not a local file; Hub names need huggingface_hub ({exc})") from None
    if local_dir:
        raise PrepareError(f"--tokenizer {name_text}: a directory that holds no tokenizer.json")
    try:
        file = hf_hub_download(name, "tokenizer.json", local_files_only=not online)
    except Exception as exc:  # noqa: BLE001
        raise _lookup_error(f"--tokenizer {name_text}", f"not found in {where}{hint}", exc, online, down) from None
    return _from_file(Path(file), name), _eos_from_config(Path(file).parent)


def _lookup_error(what: str, missing: str, exc: BaseException, online: bool, down: str | None) -> Exception:
    """The error of a failed Hub lookup: the network when it is down (``down``: why, from the probe
    before the lookup) or broke during it, else the name that was not found."""
    from train.prepare.hub import HubUnreachable, network_cause

    if down is not None:
        return HubUnreachable(f"{what}: {down}; not in the local Hugging Face cache either")
    if online and network_cause(exc):
        return HubUnreachable(f"{what}: network unreachable while asking the Hugging Face Hub ({type(exc).__name__})")
    return PrepareError(f"{what}: {missing} ({type(exc).__name__})")
