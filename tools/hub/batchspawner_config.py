"""The lab room on a SLURM cluster: batchspawner settings for a JupyterHub on a login node.

Each learner's server runs as a SLURM job on a GPU node, as that learner (cluster accounts,
PAM login). Load it after the hub's own config, e.g. at the end of jupyterhub_config.py:

    load_subconfig("/opt/openxla-lab/tools/hub/batchspawner_config.py")

It assumes the kit at /opt/openxla-lab on a filesystem every node mounts, with `make
setup-hub` run there (CHANGE the path and the partition, time and memory to your site's).
tests/test_hub.py loads it as JupyterHub does and checks every key against the traits of
batchspawner's SlurmSpawner, and renders its batch script.
"""

# ruff: noqa: F821  (get_config is provided by JupyterHub's config loader)

c = get_config()
KIT = "/opt/openxla-lab"  # CHANGE: where the kit lives on the shared filesystem

c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
c.JupyterHub.hub_ip = "0.0.0.0"  # CHANGE to an address the GPU nodes reach the hub API at
c.Spawner.cmd = [f"{KIT}/.venv-hub/bin/jupyterhub-singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~/openxla-lab"
c.Spawner.http_timeout = 300
c.Spawner.start_timeout = 900  # queued jobs: up to 15 minutes before giving up
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
c.SlurmSpawner.req_partition = "gpu"  # CHANGE
c.SlurmSpawner.req_runtime = "4:00:00"  # a session
c.SlurmSpawner.req_memory = "16G"
c.SlurmSpawner.req_nprocs = "4"
c.SlurmSpawner.req_gres = "gpu:1"
# The lessons, copied into the learner's home on each start, never overwriting (cp -n).
c.SlurmSpawner.req_prologue = (
    f"mkdir -p ~/openxla-lab && cp -rn {KIT}/notebooks/. ~/openxla-lab/\n"
    f"export PATH={KIT}/.venv-hub/bin:$PATH"
)
