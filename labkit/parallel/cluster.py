"""Launch recipes for clusters, with JAX's own cluster detection: SLURM and Kubernetes.

:func:`slurm_script` writes a SLURM batch script (one task per GPU, ``srun``, JAX's own SLURM
detection) and :func:`k8s_manifest` a Kubernetes indexed Job with a headless Service for the
coordinator; both come with validators. :func:`init_from_env` is what each process of such a
job calls. Processes on this machine are launched by :mod:`labkit.parallel.distributed`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, TypedDict

from labkit.core.types import JSON

__all__ = [
    "K8S_COORDINATOR_PORT",
    "init_from_env",
    "k8s_manifest",
    "slurm_detect",
    "slurm_port",
    "slurm_script",
    "to_yaml",
    "validate_k8s",
    "validate_slurm",
]


def init_from_env() -> None:
    """``jax.distributed.initialize`` on a cluster: SLURM is detected; else env variables.

    Kubernetes (:func:`k8s_manifest`) sets ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``
    and ``JOB_COMPLETION_INDEX`` (the pod's index in an indexed Job = its process id).
    """
    import jax

    if "JOB_COMPLETION_INDEX" in os.environ and "JAX_NUM_PROCESSES" in os.environ:
        jax.distributed.initialize(
            coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JOB_COMPLETION_INDEX"]),
        )
    else:
        jax.distributed.initialize()  # SLURM, Open MPI, Cloud TPU: detected by JAX


# ---------------------------------------------------------------------------------------
# SLURM


def slurm_port(job_id: int) -> int:
    """The coordinator port JAX's SLURM detection derives from the job id (61440..65535)."""
    return job_id % 2**12 + (65535 - 2**12 + 1)


class SlurmDetection(TypedDict):
    """What :func:`slurm_detect` found (only ``detected`` when it found no SLURM job)."""

    detected: bool
    coordinator_address: NotRequired[str]
    num_processes: NotRequired[int]
    process_id: NotRequired[int]
    local_device_ids: NotRequired[list[int | None]]  # JAX types a local id as optional


class K8sWiring(TypedDict):
    """What :func:`validate_k8s` read from a valid manifest."""

    processes: int
    coordinator: str  # host:port of process 0, through the Service


def slurm_detect(env: Mapping[str, str]) -> SlurmDetection:
    """What ``jax.distributed.initialize()`` would read under SLURM, given these variables.

    Uses JAX's own (private) ``SlurmCluster`` with ``os.environ`` temporarily replaced.
    """
    from jax._src.clusters.slurm_cluster import SlurmCluster

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        c = SlurmCluster
        if not c.is_env_present():
            return {"detected": False}
        return {
            "detected": True,
            "coordinator_address": c.get_coordinator_address(None, None),
            "num_processes": c.get_process_count(),
            "process_id": c.get_process_id(),
            "local_device_ids": [c.get_local_process_id()],
        }
    finally:
        os.environ.clear()
        os.environ.update(saved)


def slurm_script(
    command: str,
    nodes: int = 2,
    gpus_per_node: int = 8,
    job_name: str = "jax-train",
    time_limit: str = "01:00:00",
    cpus_per_task: int = 8,
) -> str:
    """A SLURM batch script: one task per GPU, launched by ``srun``; JAX detects the rest."""
    return f"""#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={gpus_per_node}
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --time={time_limit}
#SBATCH --exclusive
# {nodes * gpus_per_node} processes, one per GPU; each calls jax.distributed.initialize() with no
# arguments: JAX reads SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NODELIST.
set -euo pipefail
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY  # the coordinator is on the cluster network
srun --kill-on-bad-exit=1 {command}
"""


def validate_slurm(script: str) -> dict[str, int]:
    """Check a batch script's structure; return its numbers or raise ValueError saying why."""
    opts = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script, re.MULTILINE))
    problems = [
        f"missing #SBATCH --{k}"
        for k in ("nodes", "ntasks-per-node", "gpus-per-node")
        if k not in opts
    ]
    if not script.startswith("#!"):
        problems.append("no #! line")
    if not re.search(r"^srun ", script, re.MULTILINE):
        problems.append("no srun line (without it only one process starts per job)")
    if not problems and opts["ntasks-per-node"] != opts["gpus-per-node"]:
        problems.append("ntasks-per-node must equal gpus-per-node (one process per GPU)")
    if problems:
        raise ValueError("invalid SLURM script: " + "; ".join(problems))
    nodes, per_node = int(opts["nodes"]), int(opts["ntasks-per-node"])
    return {"nodes": nodes, "tasks_per_node": per_node, "processes": nodes * per_node}


# ---------------------------------------------------------------------------------------
# Kubernetes

K8S_COORDINATOR_PORT = 55527  # the port JAX's own K8sCluster detection uses


def k8s_manifest(
    name: str = "jax-train",
    num_processes: int = 2,
    gpus_per_pod: int = 8,
    image: str = "ghcr.io/example/labkit:latest",
    command: Sequence[str] = ("python", "train.py"),
) -> list[dict[str, JSON]]:
    """A headless Service and an indexed Job: pod i is process i, pod 0 the coordinator.

    Pods of an indexed Job with ``subdomain`` = the Service get DNS names
    ``<job>-<index>.<service>``; each reads its index from ``JOB_COMPLETION_INDEX``.
    """
    labels: dict[str, JSON] = {"app": name}
    service: dict[str, JSON] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"job-name": name},
            "ports": [{"name": "coordinator", "port": K8S_COORDINATOR_PORT}],
        },
    }
    env: list[JSON] = [
        {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{name}-0.{name}:{K8S_COORDINATOR_PORT}"},
        {"name": "JAX_NUM_PROCESSES", "value": str(num_processes)},
    ]
    container: dict[str, JSON] = {
        "name": "jax",
        "image": image,
        "command": list(command),
        "env": env,
        "ports": [{"containerPort": K8S_COORDINATOR_PORT}],
        "resources": {"limits": {"nvidia.com/gpu": gpus_per_pod}},
    }
    job: dict[str, JSON] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": num_processes,
            "parallelism": num_processes,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {"subdomain": name, "restartPolicy": "Never", "containers": [container]},
            },
        },
    }
    return [service, job]


def validate_k8s(docs: Sequence[Mapping[str, Any]]) -> K8sWiring:
    """Check the Service/Job wiring that multi-process JAX needs; raise ValueError if wrong."""
    kinds = {d.get("kind"): d for d in docs}
    if set(kinds) != {"Service", "Job"}:
        raise ValueError(f"expected one Service and one Job, got {sorted(map(str, kinds))}")
    svc, job = kinds["Service"], kinds["Job"]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    name = job["metadata"]["name"]
    checks = {
        "Service is headless (clusterIP: None)": svc["spec"].get("clusterIP") == "None",
        "Service selects the Job's pods": svc["spec"].get("selector") == {"job-name": name},
        "completionMode is Indexed": spec.get("completionMode") == "Indexed",
        "completions == parallelism": spec.get("completions") == spec.get("parallelism"),
        "pod subdomain is the Service": pod.get("subdomain") == svc["metadata"]["name"],
        "restartPolicy Never, backoffLimit 0": pod.get("restartPolicy") == "Never"
        and spec.get("backoffLimit") == 0,
    }
    env = {e["name"]: e["value"] for c in pod["containers"] for e in c.get("env", [])}
    address, host = env.get("JAX_COORDINATOR_ADDRESS", ""), f"{name}-0.{svc['metadata']['name']}"
    checks["coordinator is pod 0 via the Service"] = address.startswith(host + ":")
    checks["JAX_NUM_PROCESSES == parallelism"] = env.get("JAX_NUM_PROCESSES") == str(
        spec.get("parallelism")
    )
    failed = [k for k, ok in checks.items() if not ok]
    if failed:
        raise ValueError("invalid JAX Kubernetes manifest: " + "; ".join(failed))
    return {"processes": spec["parallelism"], "coordinator": env["JAX_COORDINATOR_ADDRESS"]}


def to_yaml(docs: Sequence[Mapping[str, JSON]]) -> str:
    """YAML text of several documents (``---`` separated), for ``kubectl apply -f``."""
    import yaml  # PyYAML: installed with papermill

    return str(yaml.safe_dump_all([dict(d) for d in docs], sort_keys=False))
