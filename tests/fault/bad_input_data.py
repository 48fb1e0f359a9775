"""Hostile data for the bad-input table (bad_input_cases.py): token files checked at load and
YAML bombs; bad_input_fixtures.py writes them, the table names them."""

from __future__ import annotations

# Token files checked at load: (hostile input, the error names, token bytes, metadata text).
_U16 = "<u2"
DATA_FILES = [
    ("uint32 tokens declared uint16 (no num_tokens)", "looks like uint32 data declared as uint16",
     ("<u4", [i % 200 + 1 for i in range(3000)]), '{"dtype": "uint16", "vocab_size": 256}'),
    ("uint32 tokens declared uint16 with num_tokens", "written as uint32?",
     ("<u4", [i % 200 for i in range(3000)]), '{"dtype": "uint16", "vocab_size": 256, "num_tokens": 3000}'),
    ("token id >= vocab_size inside the file", "token id 300 at token 1500 is not below vocab_size=256",
     (_U16, [i % 200 for i in range(1500)] + [300] + [1] * 1499), '{"dtype": "uint16", "vocab_size": 256}'),
    ("vocab_size as a string", "vocab_size must be an integer", (_U16, [1] * 3000),
     '{"dtype": "uint16", "vocab_size": "256"}'),
    ("vocab_size as a boolean", "vocab_size must be an integer", (_U16, [1] * 3000),
     '{"dtype": "uint16", "vocab_size": true}'),
    ("vocab_size 0", "vocab_size=0 is outside 1..65536", (_U16, [0] * 3000), '{"dtype": "uint16", "vocab_size": 0}'),
    ("vocab_size beyond what uint16 holds", "vocab_size=70000 is outside 1..65536", (_U16, [1] * 3000),
     '{"dtype": "uint16", "vocab_size": 70000}'),
    ("vocab_size NaN", "vocab_size must be an integer", (_U16, [1] * 3000), '{"dtype": "uint16", "vocab_size": NaN}'),
    ("dtype as a list", "dtype must be uint16 or uint32", (_U16, [1] * 3000),
     '{"dtype": ["uint16"], "vocab_size": 256}'),
    ("dtype float32", "dtype must be uint16 or uint32", (_U16, [1] * 3000), '{"dtype": "float32", "vocab_size": 256}'),
    ("metadata not an object", "must be a JSON object", (_U16, [1] * 3000), '[1, 2]'),
    ("num_tokens negative", "num_tokens=-1 is outside", (_U16, [1] * 3000),
     '{"dtype": "uint16", "vocab_size": 256, "num_tokens": -1}'),
    ("num_tokens larger than the file", "is truncated: 3000 uint16 tokens, metadata says 4000", (_U16, [1] * 3000),
     '{"dtype": "uint16", "vocab_size": 256, "num_tokens": 4000}'),
    ("metadata nested 20000 deep", "is not JSON", (_U16, [1] * 3000), "[" * 20000 + "]" * 20000),
    ("metadata of 1 MiB", "more than the 65536 allowed", (_U16, [1] * 3000), '{"pad": "' + "x" * (1 << 20) + '"}'),
    ("empty token file", "is empty", (_U16, []), '{"dtype": "uint16", "vocab_size": 256}'),
    ("metadata missing vocab_size", "missing 'vocab_size'", (_U16, [1] * 3000), '{"dtype": "uint16"}'),
]
DATA_CASES = [(what, names) for what, names, _, _ in DATA_FILES]

# YAML that must not hang or overflow: a billion-laughs alias bomb, 10 000-deep nesting, 2 MiB.
BOMB_YAML = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
SET_BOMB = "[" + ", ".join(f"&a{i} [" + ", ".join([f"*a{i - 1}" if i else "1"] * 9) + "]" for i in range(9)) + "]"
