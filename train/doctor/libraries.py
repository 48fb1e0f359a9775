"""Optional libraries ``train doctor`` checks: torchao (and whether its C++ extensions
loaded) and Transformer Engine. Each check imports the library; nothing at module level."""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path


def check_torchao() -> dict:
    """Import torchao; report its version and whether its C++ extensions loaded (torchao
    logs "Skipping import of cpp extensions ..." or "Failed to load ..." when they did not)."""
    info: dict = {"installed": False, "version": None, "cpp_extensions": None, "detail": None}
    if "torchao" in sys.modules:
        import torchao

        info.update(installed=True, version=getattr(torchao, "__version__", None),
                    cpp_extensions="unknown", detail="imported before the check; its load messages were missed")
        return info

    records: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("torchao")
    handler, old_level = _Collect(logging.DEBUG), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torchao
    except ImportError as exc:
        if getattr(exc, "name", None) == "torchao":
            return info
        info.update(installed=True, detail=f"import failed: {exc}")
        return info
    except Exception as exc:  # a broken install raises anything
        info.update(installed=True, detail=f"import failed: {type(exc).__name__}: {exc}")
        return info
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    messages = records + [str(w.message) for w in caught]
    failed = [m for m in messages if "Skipping import of cpp extensions" in m or m.startswith("Failed to load")]
    shipped = list(Path(torchao.__file__).parent.glob("_C*.so"))
    if failed:
        status = "not loaded"
    elif shipped:
        status = "loaded"
    else:
        status = "none shipped"
    info.update(installed=True, version=getattr(torchao, "__version__", None), cpp_extensions=status,
                detail=" | ".join(" ".join(m.split()) for m in failed)[:500] or None)
    return info


def check_transformer_engine() -> dict:
    info: dict = {"installed": False, "version": None, "detail": None}
    try:
        import transformer_engine
    except ImportError as exc:
        if getattr(exc, "name", None) in ("transformer_engine", None):
            return info
        info.update(installed=True, detail=f"import failed: {exc}")
        return info
    except Exception as exc:
        info.update(installed=True, detail=f"import failed: {type(exc).__name__}: {exc}")
        return info
    info.update(installed=True, version=getattr(transformer_engine, "__version__", None))
    try:
        import transformer_engine.pytorch  # noqa: F401  (loads the C++/CUDA library)
    except Exception as exc:
        info["detail"] = f"transformer_engine.pytorch import failed: {type(exc).__name__}: {exc}"
    return info
