"""The room (`make hub`): its rules, its environment, and the Kubernetes and SLURM recipes.

The rules (tools/hub/labhub.py) are plain functions; the environment is .venv-hub as `make
setup-hub` builds it (`make test` builds it first); the recipes are checked against the
engines that read them: the Zero to JupyterHub chart's values (chart 4.4.0) and the traits
of batchspawner's SlurmSpawner, loaded in .venv-hub as JupyterHub loads a config file. The
browser test of a running room is tests/test_hub_browser.py.
"""

from __future__ import annotations

import grp
import importlib.util
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hub_files import HUB, HUB_ENV, HUB_PYTHON, ROOT, load

from labkit.core import progress

labhub = load("labhub")
build_env = load("build_env")
needs_hub_env = pytest.mark.skipif(
    not (HUB_ENV / ".labkit-installed").exists(),
    reason="no .venv-hub: run `make setup-hub` (make test builds it first)",
)


# --- The room's rules ---


def test_user_names_are_safe_system_user_names() -> None:
    for good in ("alice", "bob-2", "c_d", "a" * 32):
        labhub.check_username(good)
    for bad in ("Alice", "1abc", "root;rm", "a b", "../x", "a" * 33, ""):
        with pytest.raises(labhub.RoomError, match="not allowed"):
            labhub.check_username(bad)


def test_secrets_are_random_mode_0600_and_never_replaced(tmp_path: Path) -> None:
    first, second = tmp_path / "state" / "cookie", tmp_path / "state" / "token"
    assert labhub.write_secret(first) and labhub.write_secret(second)
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert len(first.read_text().strip()) == 64 and first.read_text() != second.read_text()
    before = first.read_text()
    os.chmod(first, 0o644)
    assert not labhub.write_secret(first)  # kept, and made private again
    assert first.read_text() == before and stat.S_IMODE(first.stat().st_mode) == 0o600
    assert labhub.new_password() != labhub.new_password()


def test_accounts_list(tmp_path: Path) -> None:
    listed = tmp_path / "learners.txt"
    listed.write_text("# the room\nalice\n\nbob  # second row\nalice\n")
    assert labhub.read_accounts(listed) == ["alice", "bob"]
    listed.write_text("Mallory\n")
    with pytest.raises(labhub.RoomError):
        labhub.read_accounts(listed)


def test_an_account_the_hub_did_not_create_never_runs_a_server() -> None:
    with pytest.raises(labhub.RoomError, match="did not create"):
        labhub.ensure_learner("root", "labkit-no-such-group")


def test_lessons_are_copied_once_and_never_overwritten(tmp_path: Path) -> None:
    work = tmp_path / "home" / progress.WORK_DIR
    made = labhub.copy_lessons(work)
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9]*.ipynb"))
    assert lessons and sorted(p.name for p in work.glob("[0-9]*.ipynb")) == lessons
    assert (work / "solutions").is_dir() and work in made
    assert not list(work.rglob(".ipynb_checkpoints")) and not list(work.rglob("*.executed.ipynb"))
    welcome = work / "00_welcome.ipynb"
    assert welcome.with_suffix(".md").stat().st_mtime >= welcome.stat().st_mtime
    welcome.write_text("the learner's own edit")
    (work / "01_pjrt.ipynb").unlink()  # a learner's way to reset a lesson
    again = labhub.copy_lessons(work)
    assert again == [work / "01_pjrt.ipynb"]
    assert welcome.read_text() == "the learner's own edit"


SMI = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)
  MIG 3g.40gb     Device  0: (UUID: MIG-1111)
  MIG 3g.40gb     Device  1: (UUID: MIG-2222)
GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-cccc)
"""


def test_gpus_from_nvidia_smi_whole_gpus_and_mig_slices() -> None:
    assert labhub.detect_gpus(SMI) == ["0", "MIG-1111", "MIG-2222", "2"]
    assert labhub.detect_gpus("") == []
    assert labhub.parse_gpus("0, 1,MIG-x") == ["0", "1", "MIG-x"]
    assert labhub.parse_gpus("none") == [] and labhub.parse_gpus("") == []


def test_round_robin_and_memory_shares() -> None:
    pool = labhub.GpuRoundRobin(["0", "1"])
    assert [pool.device_for(n) for n in ("a", "b", "c", "a", "d")] == ["0", "1", "0", "0", "1"]
    assert labhub.GpuRoundRobin([]).device_for("a") is None
    assert [labhub.memory_fraction(k) for k in (1, 2, 4, 8)] == [0.9, 0.45, 0.22, 0.11]
    with pytest.raises(ValueError):
        labhub.memory_fraction(0)
    env = labhub.gpu_environment("MIG-1111", 0.22)
    assert env == {
        "CUDA_VISIBLE_DEVICES": "MIG-1111",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_CLIENT_MEM_FRACTION": "0.22",
    }


def test_the_memory_variables_are_the_ones_this_jaxlib_reads() -> None:
    source = (Path(importlib.util.find_spec("jaxlib").origin).parent / "xla_client.py").read_text()  # type: ignore[arg-type, union-attr]
    for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_CLIENT_MEM_FRACTION"):
        assert f"os.getenv('{name}'" in source, name


def test_learners_environment_points_at_the_kits_jupyter_files(tmp_path: Path) -> None:
    env = labhub.learner_environment(tmp_path / "w", ROOT / ".venv", HUB_ENV)
    assert env[progress.ENV_VAR] == str(tmp_path / "w" / progress.FILE_NAME)
    assert env["JUPYTER_PATH"].split(":")[0] == str(HUB_ENV / "share" / "jupyter")  # its kernel
    assert env["JUPYTER_CONFIG_PATH"].split(":")[0] == str(ROOT / "tools")
    assert (ROOT / "tools" / "jupyter_server_config.json").exists()


# --- The environment: a relocated interpreter, the kit's packages through one .pth ---


def test_runpath_rewrite_in_place(tmp_path: Path) -> None:
    base = (
        Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    )
    if not os.access(base, os.R_OK):
        pytest.skip(f"cannot read {base}")
    copy = tmp_path / "python"
    shutil.copy(base, copy)
    try:
        old = build_env.set_runpath(copy, "$ORIGIN/../lib")
    except build_env.BuildError as exc:
        pytest.skip(f"this interpreter has no RUNPATH to rewrite: {exc}")
    assert build_env.set_runpath(copy, "$ORIGIN/../lib") == "$ORIGIN/../lib"
    assert copy.stat().st_size == base.stat().st_size
    pairs = zip(base.read_bytes(), copy.read_bytes(), strict=True)
    changed = [i for i, (a, b) in enumerate(pairs) if a != b]
    assert changed and changed[-1] - changed[0] < len(old), "only the RUNPATH string changed"
    if shutil.which("readelf"):
        dynamic = subprocess.run(["readelf", "-d", str(copy)], capture_output=True, text=True)
        assert "[$ORIGIN/../lib]" in dynamic.stdout
    with pytest.raises(build_env.BuildError, match="longer"):
        build_env.set_runpath(copy, old)  # no room left for the old, longer path


def test_hub_requirements_are_the_pinned_hub_extra() -> None:
    reqs = build_env.hub_requirements()
    assert any(r.startswith("jupyterhub==6.") for r in reqs)
    locked = (ROOT / "constraints-hub.txt").read_text().lower()
    for req in reqs:
        assert "==" in req and req.split()[0].lower() in locked, req


@needs_hub_env
def test_hub_env_reaches_the_kits_packages_and_its_kernel_is_the_kits() -> None:
    spec = json.loads((HUB_ENV / "share/jupyter/kernels/python3/kernel.json").read_text())
    assert spec["argv"][0] == str(HUB_PYTHON)
    code = "import jax, labkit, jupyterlab, jupyterhub, sys; print(jax.__file__, labkit.__file__)"
    out = subprocess.run(
        [str(HUB_PYTHON), "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    assert out[0].startswith(str(ROOT / ".venv")) or "CONDA_PREFIX" in os.environ, out
    assert out[1] == str(ROOT / "labkit" / "__init__.py")
    assert not list((HUB_ENV / "lib").glob("python3*/site-packages/jax"))  # no second copy
    assert (HUB_ENV / "proxy/node_modules/.bin/configurable-http-proxy").exists()


@needs_hub_env
@pytest.mark.skipif(os.geteuid() != 0, reason="learners are other users only as root")
def test_a_learner_can_run_the_hub_env_without_touching_root_s_home() -> None:
    if blocking := build_env.private_folders([ROOT]):
        pytest.skip(f"the kit at {ROOT} is in a private folder ({blocking[0]}): no learner gets in")
    assert build_env.learner_problem(HUB_PYTHON) is None
    assert stat.S_IMODE(Path("/root").stat().st_mode) & 0o077 == 0, "/root was opened up"


@pytest.mark.skipif(os.geteuid() != 0, reason="learners are other users only as root")
def test_a_clone_in_a_private_folder_builds_for_trials_and_make_hub_names_the_folder(
    tmp_path: Path,
) -> None:
    # As `git clone` into a home of mode 0700 (or under `mktemp -d`): setup-hub's interpreter
    # step, then `hubctl start` as `make hub` runs it, then one of the ways out it names.
    home = Path(tempfile.mkdtemp(prefix="labkit-home-", dir="/tmp"))  # mode 0700
    group = f"lkt{secrets.token_hex(3)}"
    try:
        kit, start = home / "openxla-lab", time.perf_counter()
        target = kit / ".venv-hub"
        target.mkdir(parents=True)
        assert build_env.private_folders([target]) == [home]
        python, note = build_env.room_python(target)  # the copy no longer has to start as nobody
        assert note is not None and "\n" not in note, note  # said once, in one line
        assert note.startswith(f"note: {home} (mode 0700, owner root)") and "--same-user" in note
        copied = python.is_relative_to(target)
        if copied:  # root's pyenv: the copy starts, for root only
            subprocess.run([str(python), "-c", "import ssl, sqlite3"], check=True, timeout=60)
            assert not build_env.learners_can_run(python)
        problem = build_env.learner_problem(python, kit=kit)
        assert problem is not None and f"{home} (mode 0700, owner root) lets" in problem
        for way in ("/opt/openxla-lab", f"`chmod o+x {home}`", "HUB_ARGS=--same-user"):
            assert way in problem, way
        if copied:  # `make hub`: hubctl start stops with that message before any account
            env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
            cmd = [str(python), str(HUB / "hubctl.py"), "--state", str(tmp_path), "--group"]
            cmd += [group, "start", "--gpus", "none"]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
            assert done.returncode == 1, done.stdout + done.stderr
            assert done.stdout.startswith("error: ") and f"`chmod o+x {home}" in done.stdout
            with pytest.raises(KeyError):
                grp.getgrnam(group)
        os.chmod(home, 0o711)  # a way out: others may pass through, not list
        assert build_env.private_folders([target]) == []
        if copied:
            assert build_env.learners_can_run(python)
        assert time.perf_counter() - start < 30
    finally:
        shutil.rmtree(home)


# --- The recipes beyond one machine ---

# Chart 4.4.0's values.schema.yaml, the part the values file uses: each key a property of
# its parent (None: a free-form map, the chart passes it through).
Z2JH_SCHEMA: dict[str, Any] = {
    "hub": {"config": None},
    "singleuser": {
        "image": {"name": {}, "tag": {}},
        "defaultUrl": {},
        "extraEnv": None,
        "lifecycleHooks": None,
        "storage": {"capacity": {}},
        "memory": {"guarantee": {}, "limit": {}},
        "profileList": [],
    },
    "cull": {"enabled": {}, "timeout": {}, "every": {}},
    "proxy": {
        "https": {"enabled": {}, "type": {}, "hosts": {}, "letsencrypt": {"contactEmail": {}}}
    },
}
KUBESPAWNER_OVERRIDES = {"extra_resource_limits", "environment"}  # KubeSpawner traits used


def _unknown_keys(values: Any, schema: Any, path: str = "") -> list[str]:
    if schema is None or not isinstance(schema, dict) or not isinstance(values, dict):
        return []
    found = []
    for key, value in values.items():
        if key not in schema:
            found.append(f"{path}{key}")
        else:
            found += _unknown_keys(value, schema[key], f"{path}{key}.")
    return found


# Run in .venv-hub: load each config (a file, as JupyterHub does, or a dict), check that
# each key is a configurable trait of its class, render the SLURM batch script; print JSON.
_TRAIT_CHECK = """
import json, sys
from importlib.metadata import entry_points
from traitlets.config.loader import PyFileConfigLoader, Config
import batchspawner, jupyterhub.app, jupyterhub.auth, jupyterhub.spawner, nativeauthenticator
CLASSES = {"JupyterHub": jupyterhub.app.JupyterHub, "Authenticator": jupyterhub.auth.Authenticator,
    "NativeAuthenticator": nativeauthenticator.NativeAuthenticator,
    "Spawner": jupyterhub.spawner.Spawner, "SlurmSpawner": batchspawner.SlurmSpawner}
found = {}
for name, source in json.loads(sys.argv[1]).items():
    if isinstance(source, str):
        folder, _, file = source.rpartition("/")
        config = PyFileConfigLoader(file, path=folder).load_config()
    else:
        config = Config(source)
    unknown = [f"{s}.{k}" for s, keys in config.items() for k in keys
               if s not in CLASSES or k not in CLASSES[s].class_traits(config=True)]
    slurm = config.get("SlurmSpawner", {})
    script = batchspawner.batchspawner.format_template(
        batchspawner.SlurmSpawner.batch_script.default_value,
        **{k[4:]: v for k, v in slurm.items() if k.startswith("req_")},
        cmd=" ".join(config.get("Spawner", {}).get("cmd", [])), homedir="/home/alice",
        keepvars="ALL", srun="srun", epilogue="")
    found[name] = {"unknown": unknown, "script": script,
                   "config": json.loads(json.dumps(config, default=str))}
found["authenticators"] = [e.name for e in entry_points(group="jupyterhub.authenticators")]
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def traits() -> dict[str, Any]:
    """The trait check of both recipes, in one .venv-hub process."""
    z2jh = yaml.safe_load((HUB / "z2jh-values.yaml").read_text())["hub"]["config"]
    sources = {"z2jh": z2jh, "slurm": str(HUB / "batchspawner_config.py")}
    args = [str(HUB_PYTHON), "-c", _TRAIT_CHECK, json.dumps(sources)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout))


def test_z2jh_values_use_only_the_charts_keys_and_the_kits_settings() -> None:
    values = yaml.safe_load((HUB / "z2jh-values.yaml").read_text())
    assert _unknown_keys(values, Z2JH_SCHEMA) == []
    profiles = values["singleuser"]["profileList"]
    assert [bool(p.get("default")) for p in profiles].count(True) == 1
    for profile in profiles:
        assert profile["display_name"] and set(profile["kubespawner_override"]) <= (
            KUBESPAWNER_OVERRIDES
        )
    gpu = profiles[0]["kubespawner_override"]
    assert gpu["extra_resource_limits"] == {"nvidia.com/gpu": "1"}
    share = labhub.gpu_environment("0", labhub.memory_fraction(4))
    assert gpu["environment"] == {k: v for k, v in share.items() if k != "CUDA_VISIBLE_DEVICES"}
    assert "22%" in profiles[0]["description"]  # says the share it sets
    assert profiles[1]["kubespawner_override"]["environment"] == {"JAX_PLATFORMS": "cpu"}
    single = values["singleuser"]
    home = single["storage"].get("homeMountPath", "/home/jovyan")
    work = f"{home}/{progress.WORK_DIR}"
    assert single["extraEnv"] == {progress.ENV_VAR: f"{work}/{progress.FILE_NAME}"}
    copy = single["lifecycleHooks"]["postStart"]["exec"]["command"][-1]
    assert "cp -rn " in copy and copy.rstrip("/").endswith(work), "copies, never overwrites"
    assert values["cull"] == {"enabled": True, "timeout": 3600, "every": 600}
    assert values["proxy"]["https"]["enabled"] is True


@needs_hub_env
def test_z2jh_hub_config_is_traits_of_the_classes_it_names(traits: dict[str, Any]) -> None:
    assert traits["z2jh"]["unknown"] == []
    authenticator = traits["z2jh"]["config"]["JupyterHub"]["authenticator_class"]
    assert authenticator in traits["authenticators"]


@needs_hub_env
def test_slurm_recipe_is_batchspawner_config_and_renders_a_gpu_job(traits: dict[str, Any]) -> None:
    found = traits["slurm"]
    assert found["unknown"] == [], f"not traits of their classes: {found['unknown']}"
    config = found["config"]
    assert config["JupyterHub"]["spawner_class"] == "batchspawner.SlurmSpawner"
    script = found["script"]
    assert script.startswith("#!/bin/bash") and "#SBATCH --gres=gpu:1" in script
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --time=4:00:00" in script
    assert f"cp -rn {ROOT}/notebooks/. ~/openxla-lab/" in script  # the kit where the file is
    assert f"srun {ROOT}/.venv-hub/bin/jupyterhub-singleuser" in script
    # never every interface: the hub's API on this host's address, each server on its node's
    assert "0.0.0.0" not in config["JupyterHub"]["hub_bind_url"]
    assert 'JUPYTERHUB_SERVICE_URL="${JUPYTERHUB_SERVICE_URL/0.0.0.0/$node}"' in script
    assert "SLURM_CONF" in config["Spawner"]["env_keep"]
    same = labhub.learner_environment(
        Path("~/openxla-lab"), ROOT / ".venv", ROOT / ".venv-hub", ROOT
    )
    env = config["Spawner"]["environment"]
    for name in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTERLAB_DIR", progress.ENV_VAR):
        assert env[name] == same[name], name
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_hubctl_stop_without_a_room_leaves_nothing_and_says_so(tmp_path: Path) -> None:
    python = str(HUB_PYTHON) if HUB_PYTHON.exists() else sys.executable
    start = time.perf_counter()
    done = subprocess.run(
        [python, str(HUB / "hubctl.py"), "--state", str(tmp_path), "stop"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "was not running" in done.stdout and "no process of it is left" in done.stdout
    assert time.perf_counter() - start < 30
