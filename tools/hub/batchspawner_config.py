"""The lab room on a SLURM cluster: batchspawner settings for a JupyterHub on a login node.

Each learner's server runs as a SLURM job on a GPU node, as that learner (the site's
accounts). Load it after the room's own config: ``make hub HUB_ARGS="--extra-config
tools/hub/batchspawner_config.py --extra-config site.py"`` (hubctl passes each file to
``load_subconfig`` in that order), with your site's values (the lines marked CHANGE) in
site.py.

It assumes the kit where this file is, on a filesystem every node mounts, with `make
setup-hub` run there. tests/test_hub.py loads it as JupyterHub does, checks every key
against the traits of batchspawner's SlurmSpawner and renders its batch script;
tests/test_hub_slurm.py runs the room with it on a real SLURM cluster (this machine's,
`labkit.parallel.local_slurm`) and two learners.
"""

# ruff: noqa: F821  (get_config is provided by JupyterHub's config loader)

import os
import socket
from pathlib import Path

c = get_config()
KIT = Path(__file__).resolve().parents[2]  # the kit on the shared filesystem

c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
# The hub's API, where each job's server reports its port: on this login node's address on
# the network the GPU nodes share (CHANGE when this host's name resolves elsewhere), never
# 0.0.0.0 (every interface). The port is the one `make hub` chose.
HUB_API_IP = socket.gethostbyname(socket.gethostname())
c.JupyterHub.hub_bind_url = f"http://{HUB_API_IP}:{os.environ.get('LABKIT_HUB_API_PORT', '8081')}"
# Learners are the site's accounts: no account made on the login node, the lessons copied
# in the job (the room's own pre-spawn hook makes local accounts; not here).
c.Spawner.pre_spawn_hook = None
c.Spawner.cmd = [f"{KIT}/.venv-hub/bin/jupyterhub-singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~/openxla-lab"
c.Spawner.http_timeout = 300
c.Spawner.start_timeout = 900  # queued jobs: up to 15 minutes before giving up
# JupyterHub's list of variables a server inherits from the hub, plus SLURM_CONF: the job's
# srun and the hub's sbatch/squeue/scancel find a config that is not /etc/slurm/slurm.conf.
c.Spawner.env_keep = [
    "CONDA_DEFAULT_ENV",
    "CONDA_ROOT",
    "JUPYTERHUB_SINGLEUSER_APP",
    "LANG",
    "LC_ALL",
    "LD_LIBRARY_PATH",
    "PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "SLURM_CONF",
]
c.Spawner.environment = {
    # The kit's JupyterLab files and settings, as `make hub` gives them (labhub.py).
    "JUPYTER_PATH": f"{KIT}/.venv-hub/share/jupyter:{KIT}/.venv/share/jupyter",
    "JUPYTER_CONFIG_PATH": f"{KIT}/tools:{KIT}/.venv/etc/jupyter",
    "JUPYTERLAB_DIR": f"{KIT}/.venv/share/jupyter/lab",
    "LABKIT_PROGRESS": "~/openxla-lab/.labkit-progress.json",
    # GPU sharing as on one machine (README, "A lab room"): several learners' kernels per
    # GPU only with --gres=shard:N (SLURM's GPU sharding) or MIG; --gres=gpu:1 is a whole GPU.
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
}
# The hub runs as root (`make hub`): it submits each learner's job as that learner. A hub
# that runs as another user needs `sudo -E -u {username}` and a sudoers rule instead.
c.SlurmSpawner.exec_prefix = "runuser -u {username} --"
c.SlurmSpawner.req_partition = "gpu"  # CHANGE
c.SlurmSpawner.req_runtime = "4:00:00"  # a session
c.SlurmSpawner.req_memory = "16G"
c.SlurmSpawner.req_nprocs = "4"
c.SlurmSpawner.req_gres = "gpu:1"
# In the job, before the server starts: the lessons, copied into the learner's home, never
# overwriting (cp -n); the room's Python first on PATH; and the server's address.
# batchspawner sets every server to listen on 0.0.0.0 (all interfaces: its start() resets the
# address to the trait's default, whatever the config says); the last two lines put the
# node's own address, the one the hub reaches it at (SLURM's node name), in its place.
c.SlurmSpawner.req_prologue = "\n".join(
    [
        f"mkdir -p ~/openxla-lab && cp -rn {KIT}/notebooks/. ~/openxla-lab/",
        f"export PATH={KIT}/.venv-hub/bin:$PATH",
        "node=$(getent ahostsv4 \"$SLURMD_NODENAME\" | awk 'NR == 1 {print $1}')",
        'export JUPYTERHUB_SERVICE_URL="${JUPYTERHUB_SERVICE_URL/0.0.0.0/$node}"',
    ]
)
