"""Environment rules: documented NCCL names only, reasons for every setting, NVLS never on,
explicit P2P switch, debugging off by default, profiles/fabrics are schema-valid data."""

from __future__ import annotations

import re

import jsonschema
import pytest
import yaml

from core import catalog
from core.schema import FABRIC_SCHEMA, PROFILE_SCHEMA
from launch import envnames
from launch_testlib import (
    DOCUMENTED_NCCL,
    REPO,
    backend_argv,
    fabrics,
    job_shapes,
    profiles,
    render,
    run_inproc,
)

PACKAGE = REPO / "core"  # the hardware catalog: profiles and fabrics
REQUIRED_PROFILES = {"h100", "h200", "b200", "gb200", "rtx-pro-6000", "generic"}
REQUIRED_FABRICS = {"nvlink", "infiniband", "roce", "ethernet", "efa"}
ALL_OPTIONS = [
    "--nccl-debug", "INFO", "--nccl-debug-subsys", "INIT,NET", "--flight-recorder", "4000",
    "--p2p-broken", "--socket-ifname", "=eth0", "--ib-hca", "=mlx5_0", "--ib-gid-index", "3",
]
NCCL_NAME = re.compile(r"\bNCCL_[A-Z0-9_]+\b")


def _emitted_names(text: str) -> set[str]:
    names = set(re.findall(r"^export ([A-Za-z_][A-Za-z0-9_]*)=", text, re.M))
    names |= set(re.findall(r'^\s*- name: "([A-Za-z_][A-Za-z0-9_]*)"', text, re.M))
    names |= set(re.findall(r"--env=([A-Za-z_][A-Za-z0-9_]*)=", text))
    return names


# --------------------------------------------------------------------------- data files


def test_required_profiles_and_fabrics_exist():
    assert REQUIRED_PROFILES <= set(profiles())
    assert REQUIRED_FABRICS <= set(fabrics())


@pytest.mark.parametrize("path", sorted((PACKAGE / "profiles").glob("*.yaml")), ids=lambda p: p.stem)
def test_profile_matches_schema(path):
    jsonschema.Draft202012Validator.check_schema(PROFILE_SCHEMA)
    jsonschema.validate(yaml.safe_load(path.read_text()), PROFILE_SCHEMA)


@pytest.mark.parametrize("path", sorted((PACKAGE / "fabrics").glob("*.yaml")), ids=lambda p: p.stem)
def test_fabric_matches_schema(path):
    jsonschema.Draft202012Validator.check_schema(FABRIC_SCHEMA)
    jsonschema.validate(yaml.safe_load(path.read_text()), FABRIC_SCHEMA)


def test_schema_rejects_a_setting_without_reason():
    data = yaml.safe_load((PACKAGE / "profiles" / "h100.yaml").read_text())
    data["env"]["NCCL_DEBUG"] = {"value": "INFO"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, PROFILE_SCHEMA)


def test_profile_facts():
    facts = {name: catalog.load_profile(name) for name in REQUIRED_PROFILES}
    assert facts["h100"].arch == facts["h200"].arch == "sm_90"
    assert facts["b200"].arch == facts["gb200"].arch == "sm_100"
    assert facts["rtx-pro-6000"].arch == "sm_120"
    assert facts["gb200"].cpu_arch == "arm64" and facts["gb200"].multi_node_nvlink
    assert not facts["rtx-pro-6000"].nvlink
    assert {p.image_target for n, p in facts.items() if n in ("h100", "h200")} == {"hopper"}
    assert {p.image_target for n, p in facts.items() if n in ("b200", "gb200", "rtx-pro-6000")} == {"blackwell"}
    assert all(facts[n].nvswitch for n in ("h100", "h200", "b200", "gb200"))


def test_no_if_chains_over_hardware_names_in_code():
    # "generic" is only the default --profile value, not hardware
    names = (REQUIRED_PROFILES - {"generic"}) | {"rtx", "hopper", "blackwell", "sm_90", "sm_100", "sm_120"}
    for source in sorted(PACKAGE.rglob("*.py")):  # launch/ and launch/backends/
        if source.name == "schema.py":  # image-target enum: data
            continue
        code = "\n".join(line for line in source.read_text().splitlines() if not line.strip().startswith("#"))
        for name in names:
            assert not re.search(rf"[\"']{re.escape(name)}[\"']", code), f"{source.name} hard-codes {name!r}"


# --------------------------------------------------------------------------- NCCL names


def test_profile_and_fabric_nccl_names_are_documented():
    for name in profiles():
        for entry in catalog.load_profile(name).env:
            if entry.name.startswith("NCCL_"):
                assert entry.name in DOCUMENTED_NCCL, f"profile {name}: {entry.name}"
    for name in fabrics():
        for entry in catalog.load_fabric(name).env:
            if entry.name.startswith("NCCL_"):
                assert entry.name in DOCUMENTED_NCCL, f"fabric {name}: {entry.name}"


def test_every_nccl_name_launch_can_emit_is_documented():
    emitted: set[str] = set()
    for _, options in job_shapes():
        for backend in ("env", "k8s"):
            emitted |= _emitted_names(render(backend_argv(backend, [*options, *ALL_OPTIONS])))
    nccl = {n for n in emitted if n.startswith("NCCL_")}
    assert nccl, "nothing rendered?"
    assert nccl <= DOCUMENTED_NCCL, sorted(nccl - DOCUMENTED_NCCL)
    # the code paths that add variables by name are covered too
    code_names = set()
    for source in PACKAGE.rglob("*.py"):
        code_names |= set(NCCL_NAME.findall(source.read_text()))
    code_names -= set(envnames.NOT_NCCL)  # the refusal table names the myths on purpose
    assert code_names <= DOCUMENTED_NCCL, sorted(code_names - DOCUMENTED_NCCL)


@pytest.mark.parametrize("myth", sorted(envnames.NOT_NCCL))
def test_blog_myths_are_refused(myth):
    assert myth not in DOCUMENTED_NCCL
    rc, _, err = run_inproc(["env", "--env", f"{myth}=1"])
    assert rc == 2 and myth in err


# --------------------------------------------------------------------------- NVLS safety


def test_nvls_is_never_emitted_anywhere():
    for _, options in job_shapes():
        for backend in ("torchrun", "docker", "slurm", "env", "k8s"):
            text = render(backend_argv(backend, [*options, *ALL_OPTIONS]))
            assert not re.search(r"NCCL_NVLS_ENABLE\s*[=:]", text), (backend, options)
            assert "NCCL_NVLS_ENABLE=1" not in text


def test_nvls_any_value_but_zero_is_refused():
    for value in ("1", "2", " 1", "true"):
        assert run_inproc(["env", "--env", f"NCCL_NVLS_ENABLE={value}"])[0] == 2
    rc, out, _ = run_inproc(["env", "--env", "NCCL_NVLS_ENABLE=0"])
    assert rc == 0 and "export NCCL_NVLS_ENABLE=0" in out


def test_blackwell_profiles_leave_nvls_to_nccl():
    for name in ("b200", "gb200"):
        assert not [e for e in catalog.load_profile(name).env if e.name == "NCCL_NVLS_ENABLE"]


# --------------------------------------------------------------------------- content rules


def test_every_variable_has_a_reason_comment():
    for _, options in job_shapes():
        text = render(["env", *options, *ALL_OPTIONS])
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("export "):
                name = line[len("export "):].split("=", 1)[0]
                assert lines[i - 1].startswith(f"# {name}: ") and len(lines[i - 1]) > len(name) + 12, line


def test_torch_side_settings_always_present():
    env = _env(["--profile", "h100"])
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert int(env["OMP_NUM_THREADS"]) > 1
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "270"
    assert _env(["--grace-period", "600"])["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "570"


def test_debugging_is_off_by_default_and_opt_in():
    for _, options in job_shapes():
        env = _env(options)
        for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT"):
            assert name not in env, (options, name)
    env = _env(["--nccl-debug", "info", "--nccl-debug-subsys", "INIT,NET", "--flight-recorder"])
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert _env(["--flight-recorder", "5000"])["TORCH_FR_BUFFER_SIZE"] == "5000"


def test_pcie_workstation_keeps_p2p_unless_explicitly_broken():
    assert "NCCL_P2P_DISABLE" not in _env(["--profile", "rtx-pro-6000"])
    rc, out, _ = run_inproc(["env", "--profile", "rtx-pro-6000", "--p2p-broken"])
    assert rc == 0
    assert re.search(r"^# NCCL_P2P_DISABLE: --p2p-broken: .*IOMMU/ACS.*\nexport NCCL_P2P_DISABLE=1$", out, re.M)


def test_p2p_broken_on_nvlink_profile_warns():
    rc, _, err = run_inproc(["env", "--profile", "h100", "--p2p-broken"])
    assert rc == 0 and "also disables NVLink" in err


def test_only_needed_nccl_settings():
    assert not [n for n in _env(["--profile", "h100"]) if n.startswith("NCCL_")]
    assert not [n for n in _env(["--profile", "b200"]) if n.startswith("NCCL_")]
    assert not [n for n in _env(["--profile", "h100", "--nnodes", "2", "--fabric", "infiniband"]) if n.startswith("NCCL_")]
    # MNNVL is forced only where an IMEX domain is rendered (a k8s ComputeDomain, test_launch_k8s)
    assert "NCCL_MNNVL_ENABLE" not in _env(["--profile", "gb200"])
    assert "NCCL_MNNVL_ENABLE" not in _env(["--profile", "gb200", "--nnodes", "2", "--fabric", "infiniband"])
    roce = _env(["--profile", "h100", "--nnodes", "2", "--fabric", "roce", "--ib-hca", "=mlx5_0,mlx5_3"])
    assert roce["NCCL_IB_HCA"] == "=mlx5_0,mlx5_3" and roce["NCCL_IB_GID_INDEX"] == "3"
    eth = _env(["--profile", "h100", "--nnodes", "2", "--fabric", "ethernet"])
    assert eth["NCCL_SOCKET_IFNAME"].startswith("^lo,docker")
    assert _env(["--nnodes", "2", "--fabric", "ethernet", "--socket-ifname", "=eth1"])["NCCL_SOCKET_IFNAME"] == "=eth1"


def test_user_env_overrides_and_is_commented():
    rc, out, _ = run_inproc(["env", "--profile", "h100", "--env", "OMP_NUM_THREADS=2", "--env", "MY_VAR=x y"])
    assert rc == 0
    assert "# OMP_NUM_THREADS: set with --env\nexport OMP_NUM_THREADS=2" in out
    assert "export MY_VAR='x y'" in out
    assert out.count("export OMP_NUM_THREADS=") == 1


def _env(options: list[str]) -> dict[str, str]:
    import shlex

    text = render(["env", *options])
    result = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            result[name] = shlex.split(value)[0] if value else ""
    return result


def test_env_values_a_process_cannot_receive_and_missing_site_values_name_their_file(tmp_path):
    """One environment string over Linux's 128 KiB (MAX_ARG_STRLEN) would fail every exec of the
    job: refused at render. A profile entry without a value is the profile's, not the fabric's."""
    rc, _, err = run_inproc(["env", "--env", "BIG=" + "v" * 131072])
    assert rc == 2 and "BIG (as NAME=VALUE): 131076 bytes; Linux takes at most 131071" in err, err
    assert run_inproc(["env", "--env", "BIG=" + "v" * 131067])[0] == 0  # 131071 bytes: the most that fits
    big = "a" * 131072  # the same limit for every string the job's processes are started with
    for argv, what in ((["torchrun", "--", big], "training argument"),
                       (["torchrun", "--entrypoint", f"python {big}"], "--entrypoint word")):
        rc, _, err = run_inproc(argv)
        assert rc == 2 and f"{what}: 131072 bytes; Linux takes at most 131071" in err, err
    assert run_inproc(["torchrun", "--", "a" * 131071])[0] == 0
    h100 = yaml.safe_load((REPO / "core" / "profiles" / "h100.yaml").read_text())
    h100["env"]["SITE_THING"] = {"value": None, "why": "the site's own value"}
    path = tmp_path / "sitevalue.yaml"
    path.write_text(yaml.safe_dump(h100))
    rc, _, err = run_inproc(["env", "--profile", str(path)])
    assert rc == 2 and "profile 'sitevalue' needs SITE_THING for this site: pass --env SITE_THING=VALUE" in err, err
