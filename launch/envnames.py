"""Which environment variable names a job may set (``--env``, ``--env-secret``).

Below ``spec`` and ``envplan``, which both check names here: a valid identifier, each name
once, an ``NCCL_*`` name only if NCCL documents it (``nccl_documented_env.txt``), and never
a name that blog posts use but NCCL does not read (``NOT_NCCL``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from core.errors import SpecError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
# Kubernetes' rule for a container's variables (no shell between them and the program): also
# '.' and '-' (apimachinery's IsEnvVarName).
_K8S_ENV_NAME = re.compile(r"[-._A-Za-z][-._A-Za-z0-9]*", re.ASCII)

# Names copied around the internet that NCCL does not read (NCCL's env docs are the reference).
NOT_NCCL = {
    "NCCL_TIMEOUT": "NCCL has no timeout variable; use init_process_group(timeout=...) in torch",
    "NCCL_IB_ENABLE": "NCCL uses IB by default; the documented switch is NCCL_IB_DISABLE",
    "NCCL_P2P_ENABLE": "NCCL uses P2P by default; the documented switches are NCCL_P2P_DISABLE / NCCL_P2P_LEVEL",
    "NCCL_ENABLE_NVLS": "not an NCCL variable; launch leaves NVLS to NCCL's auto-detection",
    "NCCL_ASYNC_ERROR_HANDLING": "a torch setting, now TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "a torch setting, now TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "a torch setting, now TORCH_NCCL_DESYNC_DEBUG",
}


# Variables bash itself owns: read-only ones (an `export` of them stops the script) and ones
# that change how the launcher scripts - which export the job's environment - parse and run
# (IFS splits words, SHELLOPTS/BASHOPTS switch options, BASH_ENV/ENV source a file in every
# bash started later, CDPATH/GLOBIGNORE/POSIXLY_CORRECT change cd, globs and parsing, PS4 is
# expanded under xtrace, TMOUT times out `read`). Any name starting with BASH_ too.
SHELL_OWNED = frozenset((
    "BASH", "BASHOPTS", "BASHPID", "SHELLOPTS", "IFS", "ENV", "CDPATH", "GLOBIGNORE", "POSIXLY_CORRECT",
    "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "TMOUT", "FUNCNEST", "UID", "EUID", "PPID", "GROUPS",
    "HOSTTYPE", "OPTIND", "OPTARG", "OPTERR", "RANDOM", "SRANDOM", "SECONDS", "LINENO", "FUNCNAME",
    "PIPESTATUS", "DIRSTACK", "EPOCHSECONDS", "EPOCHREALTIME", "SHLVL", "PWD", "OLDPWD",
))


# The launcher scripts' own variables (LAUNCH_STOP_FILE, LAUNCH_RDZV_ENDPOINT, LAUNCH_ENGINE_FLAGS...):
# set by the scripts, never by the job (LAUNCH_STOP_FILE names a file the scripts write).
LAUNCH_PREFIX = "LAUNCH_"


def shell_owned(name: str) -> bool:
    return name in SHELL_OWNED or name.startswith("BASH_")


@lru_cache(maxsize=1)
def documented_nccl() -> frozenset[str]:
    """NCCL's documented variables (``launch/nccl_documented_env.txt``)."""
    text = (Path(__file__).resolve().parent / "nccl_documented_env.txt").read_text(encoding="utf-8")
    return frozenset(ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))


def check_env_name(option: str, name: str, allow_undocumented_nccl: bool = False, k8s: bool = False) -> str:
    """A valid identifier (``k8s``: Kubernetes' rule, which also takes '.' and '-'); an ``NCCL_*``
    name must be one NCCL documents (NCCL ignores a misspelt name silently) unless explicitly
    allowed."""
    rule = _K8S_ENV_NAME if k8s else _ENV_NAME
    if not rule.fullmatch(name) or name in (".", "..") or name.startswith("..") or len(name) > 255:
        what = "a Kubernetes environment variable name" if k8s else \
            "a valid environment variable name (letters, digits, '_'; Kubernetes also takes '.' and '-')"
        raise SpecError(f"{option} {name!r}: {name!r} is not {what}")
    if name in NOT_NCCL:
        raise SpecError(f"{name} is not an NCCL variable: {NOT_NCCL[name]}")
    check_not_reserved(option, name)
    if name.startswith("NCCL_") and name not in documented_nccl() and not allow_undocumented_nccl:
        raise SpecError(
            f"{option} {name}: not a documented NCCL variable (see launch/nccl_documented_env.txt); "
            "pass --allow-undocumented-nccl to set it anyway"
        )
    return name


def check_not_reserved(where: str, name: str) -> None:
    """Neither a variable bash owns nor one of the launcher scripts' own."""
    if name.startswith(LAUNCH_PREFIX):
        raise SpecError(f"{where} {name}: {LAUNCH_PREFIX}* names are the launcher scripts' own variables; "
                        "choose another name")
    if shell_owned(name):
        raise SpecError(f"{where} {name}: a variable bash itself sets or reads; the launcher scripts export "
                        "the job's environment and would break (or stop) on it")


# Variables the runtime of each backend owns: set for every worker, read as options or used by
# the rendered launcher itself. A job value there would be overwritten, or worse, obeyed (e.g.
# SLURM_JOB_NUM_NODES becomes srun --nodes, SLURM_JOB_ID the scancel target, PET_NNODES
# torchrun's --nnodes). TMPDIR (node-local scratch) and PYTHONUNBUFFERED (the operator's value
# is 1 too) stay the user's. One list per owner: torchrun's here (every backend runs it), the
# others in the backend module whose runtime owns them (its ``Backend.owned``).
@dataclass(frozen=True)
class Owned:
    owner: str
    names: frozenset[str]
    prefixes: tuple[str, ...]

    def owns(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


TORCHRUN_OWNED = Owned(
    "torchrun (it sets them for each worker, or reads PET_* as its options)",
    frozenset(("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")),
    ("TORCHELASTIC_", "PET_"),
)
def check_not_owned(owners, named) -> None:
    """``named``: (where, name) pairs, e.g. ("--env", "SLURM_JOB_ID"); none may be a name one of
    ``owners`` (the backend's ``Owned`` lists) owns."""
    for where, name in named:
        for owned in owners:
            if owned.owns(name):
                raise SpecError(f"{where} {name}: reserved, set by {owned.owner}; a job value would be "
                                "overwritten or change how the job is started; choose another name")


def check_unique_env(names) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SpecError(f"environment variable {name} is given twice (--env / --env-secret)")
        seen.add(name)
