"""Launch recipes for clusters, with JAX's own cluster detection: SLURM and Kubernetes.

:func:`slurm_script` writes a SLURM batch script and :func:`srun_line` the same launch as one
``srun`` command line (one task per GPU, or per group of CPU devices; JAX's own SLURM
detection), both from :func:`launch_options`, so that what the kit prints is what it runs.
:func:`k8s_manifest` writes a Kubernetes indexed Job with a headless Service for the
coordinator; :func:`validate_k8s_schema` checks it against Kubernetes' own schema, offline.
Each task runs ``python -m labkit.parallel.cluster TARGET [ARGS]``: :func:`run_task` calls
:func:`init_from_env` and a ``"module:function"``, and prints its JSON result on one line
that :func:`task_results` reads back. Processes on one machine without a scheduler are
launched by :mod:`labkit.parallel.distributed`; a SLURM cluster on this machine, for trials
and tests, is :mod:`labkit.parallel.local_slurm`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import socket
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, TypedDict

from labkit.core.types import JSON
from labkit.parallel.distributed import cpu_collectives_on, listening

__all__ = [
    "K8S_COORDINATOR_PORT",
    "K8S_SCHEMA_VERSION",
    "RESULT_TAG",
    "TaskResult",
    "init_from_env",
    "k8s_manifest",
    "launch_options",
    "run_task",
    "slurm_detect",
    "slurm_port",
    "slurm_script",
    "srun_line",
    "task_command",
    "task_results",
    "to_yaml",
    "validate_k8s",
    "validate_k8s_schema",
    "validate_slurm",
]


def init_from_env(heartbeat_timeout_seconds: int = 100) -> None:
    """``jax.distributed.initialize`` on a cluster: SLURM is detected; else env variables.

    Kubernetes (:func:`k8s_manifest`) sets ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``
    and ``JOB_COMPLETION_INDEX`` (the pod's index in an indexed Job = its process id). On
    CPUs under SLURM, JAX's CPU collectives (gloo) listen on this node's address as SLURM
    names it (``SLURMD_NODENAME``), not on whatever the host name resolves to.
    """
    import jax

    if "JOB_COMPLETION_INDEX" in os.environ and "JAX_NUM_PROCESSES" in os.environ:
        jax.distributed.initialize(
            coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JOB_COMPLETION_INDEX"]),
            heartbeat_timeout_seconds=heartbeat_timeout_seconds,
        )
        return
    # SLURM, Open MPI, Cloud TPU: detected by JAX
    jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_seconds)
    node = os.environ.get("SLURMD_NODENAME")
    if node and os.environ.get("JAX_PLATFORMS") == "cpu":
        cpu_collectives_on(socket.gethostbyname(node))


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


def launch_options(kill_on_bad_exit: bool = True) -> str:
    """The ``srun`` options every recipe launches with (the one source of both recipes)."""
    return ("--kill-on-bad-exit=1 " if kill_on_bad_exit else "") + "--label"


WHY_KILL = (
    "# --kill-on-bad-exit=1: when one task fails, srun ends the others at once; without it\n"
    "# they wait in their next collective until JAX's heartbeat timeout (100 s by default)\n"
    "# aborts them.\n"
    "# --label: each line of output starts with its task's rank.\n"
)
WHY_BIND = (
    "# Task 0 runs JAX's coordinator on the first node, on port SLURM_JOB_ID % 4096 + 61440. It\n"
    "# listens on every interface unless told: bind it to the address the other tasks reach.\n"
)


def _cpu_exports(cpu_devices: int) -> str:
    return f"JAX_PLATFORMS=cpu JAX_NUM_CPU_DEVICES={cpu_devices}" if cpu_devices else ""


def slurm_script(
    command: str,
    nodes: int = 2,
    gpus_per_node: int = 8,
    job_name: str = "jax-train",
    time_limit: str = "01:00:00",
    cpus_per_task: int = 8,
    *,
    tasks_per_node: int | None = None,
    cpu_devices: int = 0,
) -> str:
    """A SLURM batch script: one task per GPU (or, with ``cpu_devices``, per group of that
    many CPU devices: ``gpus_per_node=0``), launched by ``srun``; JAX detects the rest."""
    tasks = gpus_per_node if tasks_per_node is None else tasks_per_node
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={tasks}",
        *([f"#SBATCH --gpus-per-node={gpus_per_node}"] if gpus_per_node else []),
        f"#SBATCH --cpus-per-task={cpus_per_task}",
        f"#SBATCH --time={time_limit}",
        *(["#SBATCH --exclusive"] if gpus_per_node else []),
        f"# {nodes * tasks} processes, one per {'GPU' if gpus_per_node else 'task'}; each "
        "calls jax.distributed.initialize() with no",
        "# arguments: JAX reads SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NODELIST.",
        "set -euo pipefail",
        "unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY  # the coordinator is on the "
        "cluster network",
    ]
    if cpu_devices:
        lines.append(f"export {_cpu_exports(cpu_devices)}  # no GPUs: CPU devices per task")
    lines += [
        WHY_BIND.rstrip("\n"),
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "address=$(getent ahostsv4 \"$first\" | awk 'NR == 1 {print $1}')",
        'export JAX_COORDINATOR_BIND_ADDRESS="$address:$((SLURM_JOB_ID % 4096 + 61440))"',
        WHY_KILL.rstrip("\n"),
        f"srun {launch_options()} {command}",
    ]
    return "\n".join(lines) + "\n"


def srun_line(
    command: str,
    nodelist: Sequence[str],
    tasks_per_node: int,
    first_address: str,
    port: int,
    cpu_devices: int = 0,
    kill_on_bad_exit: bool = True,
) -> str:
    """The same launch as :func:`slurm_script`, as one ``srun`` line to type in a shell.

    Without a batch script the job id is not known in advance, so the coordinator's port is
    given (``JAX_COORDINATOR_PORT``, which JAX's detection reads) and bound to the address of
    the first node of ``nodelist``, where task 0 runs.
    """
    env = f"JAX_COORDINATOR_PORT={port} JAX_COORDINATOR_BIND_ADDRESS={first_address}:{port}"
    if cpu_devices:
        env += " " + _cpu_exports(cpu_devices)
    where = f"--nodelist={','.join(nodelist)} --nodes={len(nodelist)}"
    return (
        f"{env} srun {where} --ntasks-per-node={tasks_per_node} "
        f"{launch_options(kill_on_bad_exit)} {command}"
    )


def validate_slurm(script: str) -> dict[str, int]:
    """Check a batch script's structure; return its numbers or raise ValueError saying why."""
    opts = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", script, re.MULTILINE))
    problems = [f"missing #SBATCH --{k}" for k in ("nodes", "ntasks-per-node") if k not in opts]
    if not script.startswith("#!"):
        problems.append("no #! line")
    if not re.search(r"^srun ", script, re.MULTILINE):
        problems.append("no srun line (without it only one process starts per job)")
    elif not re.search(r"^srun .*--kill-on-bad-exit=1", script, re.MULTILINE):
        problems.append("srun without --kill-on-bad-exit=1 (a failed task leaves the others hung)")
    if not re.search(r"^export JAX_COORDINATOR_BIND_ADDRESS=", script, re.MULTILINE):
        problems.append("no JAX_COORDINATOR_BIND_ADDRESS (the coordinator binds every interface)")
    gpus = opts.get("gpus-per-node")
    if not problems and gpus is not None and opts["ntasks-per-node"] != gpus:
        problems.append("ntasks-per-node must equal gpus-per-node (one process per GPU)")
    if gpus is None and "JAX_NUM_CPU_DEVICES=" not in script:
        problems.append("no --gpus-per-node and no JAX_NUM_CPU_DEVICES (which devices?)")
    if problems:
        raise ValueError("invalid SLURM script: " + "; ".join(problems))
    nodes, per_node = int(opts["nodes"]), int(opts["ntasks-per-node"])
    return {"nodes": nodes, "tasks_per_node": per_node, "processes": nodes * per_node}


# ---------------------------------------------------------------------------------------
# What each task runs: python -m labkit.parallel.cluster TARGET [JSON] [--heartbeat-s S]

RESULT_TAG = "labkit-result"  # the line each task prints its result on


def task_command(
    target: str,
    args: Mapping[str, JSON] | None = None,
    heartbeat_s: int | None = None,
    python: str = sys.executable,
) -> str:
    """The command line of one task: run ``target`` (``"module:function"``) under SLURM."""
    words = [python, "-m", "labkit.parallel.cluster", target]
    if args:
        words.append(json.dumps(dict(args), separators=(",", ":")))
    if heartbeat_s is not None:
        words += ["--heartbeat-s", str(heartbeat_s)]
    return shlex.join(words)


class TaskResult(TypedDict):
    """What one task printed on its result line."""

    rank: int
    node: str
    job: int
    value: JSON
    listening: list[list[Any]]  # [address, port, pid] of each TCP socket it listened on


def run_task(argv: Sequence[str]) -> int:
    """In each task: :func:`init_from_env`, ``target(**args)``, one result line; 0 or 1."""
    cli = argparse.ArgumentParser(prog="python -m labkit.parallel.cluster")
    cli.add_argument("target", help='"module:function"')
    cli.add_argument("args", nargs="?", default="{}", help="JSON object of keyword arguments")
    cli.add_argument("--heartbeat-s", type=int, default=100, help="JAX's heartbeat timeout")
    opts = cli.parse_args(argv)
    rank, node = int(os.environ.get("SLURM_PROCID", "0")), os.environ.get("SLURMD_NODENAME", "")
    job = int(os.environ.get("SLURM_JOB_ID", "0"))
    print(f"labkit-task start job={job} node={node} pid={os.getpid()} t={time.time():.3f}")
    sys.stdout.flush()
    try:
        import jax

        init_from_env(opts.heartbeat_s)
        module, name = opts.target.split(":", 1)
        value = getattr(importlib.import_module(module), name)(**json.loads(opts.args))
        found: TaskResult = {
            "rank": rank,
            "node": node,
            "job": job,
            "value": value,
            "listening": [list(s) for s in listening([os.getpid()])],
        }
        print(f"{RESULT_TAG} {json.dumps(found)}", flush=True)
        jax.distributed.shutdown()
    except Exception:  # the traceback goes to the task's output, then the task fails
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # not sys.exit: JAX's atexit shutdown would wait for the healthy peers
    return 0


def task_results(output: str) -> dict[int, TaskResult]:
    """The result line of each task in ``srun --label`` output (or a job's output file)."""
    found: dict[int, TaskResult] = {}
    for line in output.splitlines():
        if (at := line.find(RESULT_TAG + " ")) >= 0:
            result: TaskResult = json.loads(line[at + len(RESULT_TAG) + 1 :])
            found[result["rank"]] = result
    return dict(sorted(found.items()))


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


K8S_SCHEMA_VERSION = "1.37"  # the newest schema kubernetes-validate 1.37.0 carries


def validate_k8s_schema(
    docs: Sequence[Mapping[str, Any]], version: str = K8S_SCHEMA_VERSION
) -> list[str]:
    """Check every object against Kubernetes' own schema for ``version``, offline.

    kubernetes-validate carries the OpenAPI schemas of each Kubernetes release; strict mode
    also rejects fields the schema does not know (a misspelt key). Returns ``"Kind: ok
    against v1.37"`` per object, or raises ValueError naming the object, path and message.
    """
    import kubernetes_validate

    found = []
    for doc in docs:
        try:
            checked = kubernetes_validate.validate(dict(doc), version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path) or "(top)"
            raise ValueError(
                f"{doc.get('kind')} {doc.get('metadata', {}).get('name')!r} does not match "
                f"Kubernetes {version}'s schema at {path}: {exc.message}"
            ) from None
        found.append(f"{doc['kind']}: ok against v{checked}")
    return found


if __name__ == "__main__":
    sys.exit(run_task(sys.argv[1:]))
