"""Kubeflow Trainer v2.4.0's rules that touch what launch renders, checked on every runtime
launch renders (profiles x fabrics, the committed k8s/ files, the goldens) next to the v2.3.0
checks of k8s_checks. The rules come from the v2.4.0 release notes (read, not run against its
CRDs: see docs/launch.md)."""

from __future__ import annotations

import copy

import pytest
import yaml

from k8s_checks import check_manifests, render_docs
from k8s_operators import REPLICATED_JOB_MAX_V24, runtime_v24_errors
from launch_testlib import REPO, fabrics, profiles, run_inproc

pytestmark = pytest.mark.timeout(300)

RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")


def _committed_runtimes() -> list[tuple[str, dict]]:
    files = [*sorted((REPO / "k8s").glob("*.yaml")), *sorted((REPO / "tests/launch/golden").glob("k8s*.yaml"))]
    return [(path.name, doc) for path in files for doc in yaml.safe_load_all(path.read_text())
            if doc and doc.get("kind") in RUNTIME_KINDS]


def test_committed_runtimes_keep_replicated_job_names_within_20_characters():
    runtimes = _committed_runtimes()
    assert len(runtimes) >= 8  # every committed TrainJob file brings or names one
    for name, runtime in runtimes:
        rjobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        assert rjobs and all(len(r["name"]) <= REPLICATED_JOB_MAX_V24 for r in rjobs), name
        assert not runtime_v24_errors(runtime), name


@pytest.mark.parametrize("profile", profiles())
def test_every_profile_and_fabric_renders_v24_runtimes(profile):
    checked = 0
    for fabric in fabrics():
        nnodes = "1" if fabric in ("nvlink", "pcie") else "2"
        for sub in ("k8s", "k8s-runtime"):
            argv = [sub, "--profile", profile, "--fabric", fabric, "--nnodes", nnodes]
            if fabric in ("infiniband", "roce", "efa"):
                argv += ["--rdma-resource", "rdma/ib=1"]
            rc, out, err = run_inproc(argv)
            if rc != 0:  # a pair launch refuses (e.g. an NVLink fabric on a profile without it)
                assert rc == 2 and len(err.strip().splitlines()) == 1, err
                continue
            for doc in yaml.safe_load_all(out):
                if doc["kind"] in RUNTIME_KINDS:
                    assert not runtime_v24_errors(doc), (argv, runtime_v24_errors(doc))
                    checked += 1
    assert checked >= 4, checked  # each profile renders on several fabrics, as a job and a shared runtime


def test_the_v24_rule_refuses_a_longer_name_and_v23_checks_still_pass():
    docs = render_docs(["k8s", "--profile", "h100", "--nnodes", "2", "--fabric", "infiniband"])
    check_manifests(docs)  # v2.3.0 CRDs and webhooks, with the v2.4.0 rule
    runtime = next(d for d in docs if d["kind"] in RUNTIME_KINDS)
    longer = copy.deepcopy(runtime)
    longer["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "n" * (REPLICATED_JOB_MAX_V24 + 1)
    assert runtime_v24_errors(longer) == [f"replicatedJob {'n' * 21!r}: 21 characters, Trainer v2.4.0 allows 20"]
    assert runtime_v24_errors(runtime) == []
