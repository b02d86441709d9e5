"""labkit.parallel.cluster: SLURM and Kubernetes recipes, their validators, JAX's detection."""

from __future__ import annotations

import copy
import os
import shlex

import pytest
import yaml

from labkit.parallel import cluster

# ---------------------------------------------------------------------------------------
# SLURM


def test_slurm_script_structure() -> None:
    script = cluster.slurm_script("python -m train", nodes=4, gpus_per_node=8)
    assert cluster.validate_slurm(script) == {"nodes": 4, "tasks_per_node": 8, "processes": 32}
    assert "\nsrun " in script and "--gpus-per-node=8" in script


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("srun --kill-on-bad-exit=1 ", "", "no srun"),
        ("--ntasks-per-node=8", "--ntasks-per-node=1", "one process per GPU"),
        ("#SBATCH --nodes=2\n", "", "missing #SBATCH --nodes"),
        ("srun --kill-on-bad-exit=1 ", "srun ", "without --kill-on-bad-exit=1"),
        ("export JAX_COORDINATOR_BIND_ADDRESS=", "export X=", "no JAX_COORDINATOR_BIND_ADDRESS"),
        ("#SBATCH --gpus-per-node=8\n", "", "no --gpus-per-node and no JAX_NUM_CPU_DEVICES"),
    ],
)
def test_slurm_validator_rejects(old: str, new: str, why: str) -> None:
    script = cluster.slurm_script("python -m train").replace(old, new)
    with pytest.raises(ValueError, match=why):
        cluster.validate_slurm(script)


def test_slurm_detection_reads_the_job() -> None:
    before = dict(os.environ)
    env = {
        "SLURM_JOB_ID": "100",
        "SLURM_STEP_NODELIST": "node[003-004],x",
        "SLURM_NTASKS": "16",
        "SLURM_PROCID": "12",
        "SLURM_LOCALID": "4",
    }
    found = cluster.slurm_detect(env)
    assert found == {
        "detected": True,
        "coordinator_address": f"node003:{cluster.slurm_port(100)}",
        "num_processes": 16,
        "process_id": 12,
        "local_device_ids": [4],
    }
    assert 61440 <= cluster.slurm_port(100) <= 65535
    assert cluster.slurm_detect({"SLURM_JOB_ID": "1"}) == {"detected": False}
    assert dict(os.environ) == before


# ---------------------------------------------------------------------------------------
# Kubernetes


def test_k8s_manifest_parses_and_wires_the_coordinator() -> None:
    docs = list(yaml.safe_load_all(cluster.to_yaml(cluster.k8s_manifest("t", num_processes=4))))
    assert docs == cluster.k8s_manifest("t", num_processes=4)  # the YAML says what the dicts say
    service, job = docs
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] == "t"
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env == {
        "JAX_COORDINATOR_ADDRESS": f"t-0.t:{cluster.K8S_COORDINATOR_PORT}",
        "JAX_NUM_PROCESSES": "4",
    }
    assert cluster.validate_k8s(docs)["processes"] == 4
    assert "&id" not in cluster.to_yaml(docs)  # no YAML anchors: plain to read


def _drop_mode(d: list) -> None:
    del d[1]["spec"]["completionMode"]


def _not_headless(d: list) -> None:
    d[0]["spec"]["clusterIP"] = "10.0.0.1"


def _no_subdomain(d: list) -> None:
    del d[1]["spec"]["template"]["spec"]["subdomain"]


def _wrong_count(d: list) -> None:
    d[1]["spec"]["parallelism"] = 3


@pytest.mark.parametrize(
    ("break_it", "why"),
    [
        (_drop_mode, "Indexed"),
        (_not_headless, "headless"),
        (_no_subdomain, "subdomain"),
        (_wrong_count, "parallelism"),
    ],
)
def test_k8s_validator_rejects(break_it: object, why: str) -> None:
    docs = copy.deepcopy(cluster.k8s_manifest())
    break_it(docs)  # type: ignore[operator]
    with pytest.raises(ValueError, match=why):
        cluster.validate_k8s(docs)


def test_init_from_env_passes_the_k8s_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    import jax

    seen: dict = {}
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: seen.update(kw))
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "3")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "j-0.j:55527")
    cluster.init_from_env()
    assert seen == {
        "coordinator_address": "j-0.j:55527",
        "num_processes": 4,
        "process_id": 3,
        "heartbeat_timeout_seconds": 100,
    }


def test_init_from_env_under_slurm_detects_and_puts_gloo_on_the_nodes_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import jax

    seen: dict = {}
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: seen.update(kw))
    monkeypatch.setattr(cluster, "cpu_collectives_on", lambda address: seen.update(gloo=address))
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    monkeypatch.setenv("SLURMD_NODENAME", "localhost")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    cluster.init_from_env(heartbeat_timeout_seconds=7)
    assert seen == {"heartbeat_timeout_seconds": 7, "gloo": "127.0.0.1"}  # JAX detects the rest


def test_the_cpu_recipe_and_the_task_command() -> None:
    command = cluster.task_command("m:f", {"steps": 2}, heartbeat_s=3, python="python")
    assert shlex.split(command) == [
        "python",
        "-m",
        "labkit.parallel.cluster",
        "m:f",
        '{"steps":2}',
        "--heartbeat-s",
        "3",
    ]
    script = cluster.slurm_script(command, 2, 0, tasks_per_node=1, cpu_devices=4, cpus_per_task=1)
    assert "--gpus-per-node" not in script and "--exclusive" not in script
    assert "export JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES=4" in script
    assert cluster.validate_slurm(script)["processes"] == 2


def test_k8s_manifests_match_kubernetes_own_schema_offline() -> None:
    found = cluster.validate_k8s_schema(cluster.k8s_manifest("t", num_processes=4))
    assert found == [
        f"Service: ok against v{cluster.K8S_SCHEMA_VERSION}",
        f"Job: ok against v{cluster.K8S_SCHEMA_VERSION}",
    ]
    docs = copy.deepcopy(cluster.k8s_manifest())
    docs[1]["spec"]["template"]["spec"]["restartPolicy"] = "Sometimes"  # not in the enum
    docs[1]["spec"]["backofLimit"] = 0  # misspelt: strict mode refuses unknown fields
    with pytest.raises(ValueError, match="backofLimit"):
        cluster.validate_k8s_schema(docs)
