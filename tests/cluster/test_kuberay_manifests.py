"""cluster/kuberay/*.yaml and cluster/Dockerfile with no cluster, no network and no Ray: each
manifest against KubeRay's published CRD schema (cluster/kuberay/schemas/), the image and the
manifests against the versions pyproject.toml, .ci/floors.txt and the launcher configs name, and
every cluster file against pyproject.toml's floors and the hub switches. Each check passes on
the shipped files and is shown to catch a broken copy."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import test_dependency_floors as floors  # pyproject.toml's floors and .ci/floors.txt's pins
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from test_launcher_configs import CLUSTER, CONFIGS, checker

REPO = CLUSTER.parent
KUBERAY = CLUSTER / "kuberay"
SCHEMAS = KUBERAY / "schemas"
DOCKERFILE = CLUSTER / "Dockerfile"
MANIFESTS = {"raycluster": KUBERAY / "raycluster.yaml", "rayjob": KUBERAY / "rayjob.yaml"}
KINDS = {"raycluster": ("RayCluster", "rayclusters"), "rayjob": ("RayJob", "rayjobs")}
HUB_SWITCHES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# The project's images: distributed-emb:<project version>-ray<Ray>-py<Python digits>.
IMAGE = re.compile(r"distributed-emb:(?P<version>[\w.]+?)-ray(?P<ray>[\d.]+\d)-py(?P<python>\d+)")
RAY_IMAGE = re.compile(r"rayproject/ray:(?P<ray>[\d.]+\d)-py(?P<python>\d+)(?P<platform>-[\w.]+)?")


def _manifest(name: str) -> dict:
    return yaml.safe_load(MANIFESTS[name].read_text())


@pytest.fixture(params=sorted(MANIFESTS))
def shipped(request) -> tuple[str, dict]:
    return request.param, _manifest(request.param)


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{KINDS[name][1]}.v1.json").read_text())


def _path(parts) -> str:
    return ".".join(str(p) for p in parts) or "(top)"


def _unknown_fields(value, schema: dict, where: tuple = ()) -> list[str]:
    """Fields the schema does not declare, which `kubectl apply --validate=strict` (kubectl's
    default) refuses; JSON Schema alone lets them through."""
    problems = []
    if isinstance(value, dict) and isinstance(schema, dict):
        declared = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if declared is not None and key in declared:
                problems += _unknown_fields(item, declared[key], (*where, key))
            elif isinstance(extra, dict):
                problems += _unknown_fields(item, extra, (*where, key))
            elif declared is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                problems.append(f"{_path((*where, key))}: unknown field")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            problems += _unknown_fields(item, schema["items"], (*where, index))
    return problems


def _cel_guarded_fields(value, schema: dict, where: tuple = ()) -> list[str]:
    """Fields whose CRD rules are CEL (x-kubernetes-validations), which jsonschema cannot run."""
    found = (
        [_path(where)] if isinstance(schema, dict) and "x-kubernetes-validations" in schema else []
    )
    if isinstance(value, dict):
        declared = schema.get("properties") or {}
        for key, item in value.items():
            sub = declared.get(key, schema.get("additionalProperties"))
            if isinstance(sub, dict):
                found += _cel_guarded_fields(item, sub, (*where, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += _cel_guarded_fields(item, schema["items"], (*where, index))
    return found


def _problems(name: str, manifest: dict) -> list[str]:
    """What the API server would refuse in `manifest`, per KubeRay's schema for its kind."""
    schema = _schema(name)
    validator = jsonschema.Draft4Validator(schema)  # OpenAPI v3.0: close to JSON Schema draft 4
    problems = [
        f"{_path(error.absolute_path)}: {error.message}"
        for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path))
    ]
    return problems + _unknown_fields(manifest, schema)


def _containers(spec: dict) -> list[tuple[str, dict]]:
    """(group, container) of every Ray container in a RayCluster spec."""
    groups = [("head", spec["headGroupSpec"])] + [
        (group["groupName"], group) for group in spec.get("workerGroupSpecs", [])
    ]
    return [
        (name, container)
        for name, group in groups
        for container in group["template"]["spec"]["containers"]
    ]


def _cluster_text_files() -> dict[Path, str]:
    """Every file under cluster/ that people write (not the schemas copied from KubeRay)."""
    return {
        path: path.read_text()
        for path in sorted(CLUSTER.rglob("*"))
        if path.is_file() and SCHEMAS not in path.parents and "__pycache__" not in path.parts
    }


# --- the CRD schemas -------------------------------------------------------------------------


def test_the_schemas_are_kuberays_v1_crd_schemas_with_their_source():
    readme = (SCHEMAS / "README.md").read_text()
    for name, (_, plural) in KINDS.items():
        schema = _schema(name)
        jsonschema.Draft4Validator.check_schema(schema)
        assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
        assert f"ray-operator/config/crd/bases/ray.io_{plural}.yaml" in readme
        assert f"`{plural}.v1.json` | `{plural}.ray.io` | `v1`" in readme
    assert "github.com/ray-project/kuberay" in readme
    assert re.search(r"tag `v\d+\.\d+\.\d+`, commit `[0-9a-f]{40}`", readme), readme


# --- the shipped manifests -------------------------------------------------------------------


def test_each_manifest_validates_against_its_crd_schema(shipped):
    name, manifest = shipped
    kind, _ = KINDS[name]
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", kind)
    assert _problems(name, manifest) == []


def test_no_manifest_sets_a_field_checked_only_by_cel_rules(shipped):
    # jsonschema does not run the CRDs' CEL rules (managedBy, deletionStrategy, GCS fault
    # tolerance backend); a manifest that sets none of those fields has none to break.
    name, manifest = shipped
    assert _cel_guarded_fields(manifest, _schema(name)) == []
    broken = copy.deepcopy(manifest)
    broken["spec"]["managedBy"] = "ray.io/kuberay-operator"
    assert _cel_guarded_fields(broken, _schema(name)) == ["spec.managedBy"]


def _parent(manifest: dict, path: tuple):
    target = manifest
    for part in path[:-1]:
        target = target[part]
    return target


def _set(path: tuple, value):
    def mutate(manifest):
        _parent(manifest, path)[path[-1]] = value

    return mutate


def _rename(path: tuple, new_key: str):
    def mutate(manifest):
        parent = _parent(manifest, path)
        parent[new_key] = parent.pop(path[-1])

    return mutate


def _delete(path: tuple):
    def mutate(manifest):
        del _parent(manifest, path)[path[-1]]

    return mutate


WORKER = ("spec", "workerGroupSpecs", 0)
WORKER_CONTAINER = (*WORKER, "template", "spec", "containers", 0)
BROKEN = {
    "maxReplicas-as-a-string": (
        "raycluster",
        _set((*WORKER, "maxReplicas"), "8"),
        "spec.workerGroupSpecs.0.maxReplicas: '8' is not of type 'integer'",
    ),
    "autoscaling-flag-as-a-string": (
        "raycluster",
        _set(("spec", "enableInTreeAutoscaling"), "yes"),
        "spec.enableInTreeAutoscaling: 'yes' is not of type 'boolean'",
    ),
    "auth-mode-outside-its-enum": (
        "raycluster",
        _set(("spec", "authOptions", "mode"), "tokens"),
        "spec.authOptions.mode: 'tokens' is not one of ['disabled', 'token']",
    ),
    "worker-group-without-maxReplicas": (
        "raycluster",
        _delete((*WORKER, "maxReplicas")),
        "spec.workerGroupSpecs.0: 'maxReplicas' is a required property",
    ),
    "gpu-limit-that-is-no-quantity": (
        "raycluster",
        _set((*WORKER_CONTAINER, "resources", "limits", "nvidia.com/gpu"), "one"),
        "resources.limits.nvidia.com/gpu: 'one' does not match",
    ),
    "misspelt-minReplicas": (
        "raycluster",
        _rename((*WORKER, "minReplicas"), "minReplica"),
        "spec.workerGroupSpecs.0.minReplica: unknown field",
    ),
    "env-from-a-secret-misspelt": (
        "raycluster",
        _rename((*WORKER_CONTAINER, "env", 0, "valueFrom"), "valuesFrom"),
        "containers.0.env.0.valuesFrom: unknown field",
    ),
    "entrypoint-as-a-list": (
        "rayjob",
        _set(("spec", "entrypoint"), ["python", "jobs/train_informin.py"]),
        "spec.entrypoint: ['python', 'jobs/train_informin.py'] is not of type 'string'",
    ),
    "runtime-env-as-a-mapping-not-yaml-text": (
        "rayjob",
        _set(("spec", "runtimeEnvYAML"), {"env_vars": {}}),
        "spec.runtimeEnvYAML: {'env_vars': {}} is not of type 'string'",
    ),
    "cluster-selector-with-a-number": (
        "rayjob",
        _set(("spec", "clusterSelector", "ray.io/cluster"), 1),
        "spec.clusterSelector.ray.io/cluster: 1 is not of type 'string'",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_the_schema_rejects_a_broken_manifest(case):
    name, mutate, expected = BROKEN[case]
    manifest = _manifest(name)
    assert _problems(name, manifest) == []  # the starting point passes
    mutate(manifest)
    problems = _problems(name, manifest)
    assert any(expected in p for p in problems), problems


def test_the_cluster_has_a_cpu_head_and_gpu_workers_that_scale_from_zero():
    cluster = _manifest("raycluster")
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["authOptions"]["mode"] == "token"  # as every node of the launcher configs
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # drivers and controllers only
    for container in head["template"]["spec"]["containers"]:
        assert "nvidia.com/gpu" not in container.get("resources", {}).get("limits", {})
    assert spec["workerGroupSpecs"]
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] == 0 and group.get("replicas", 0) == 0, group["groupName"]
        assert group["minReplicas"] <= group["maxReplicas"]
        [container] = group["template"]["spec"]["containers"]
        assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1, group["groupName"]


def _most_gpus(cluster: dict) -> int:
    """GPUs of the cluster with every worker group at its maxReplicas."""
    return sum(
        int(container["resources"]["limits"].get("nvidia.com/gpu", 0)) * group["maxReplicas"]
        for group in cluster["spec"]["workerGroupSpecs"]
        for container in group["template"]["spec"]["containers"]
    )


def test_storage_credentials_come_from_a_secret_on_every_ray_container():
    spec = _manifest("raycluster")["spec"]
    names = set()
    for group, container in _containers(spec):
        env = {entry["name"]: entry for entry in container.get("env", [])}
        names.add(frozenset(env))
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert "value" not in env[key], f"{group}: {key} written into the manifest"
            assert env[key]["valueFrom"]["secretKeyRef"]["key"] == key, group
    assert len(names) == 1  # the driver (head) and every Train worker read the same storage


def _entrypoint(job: dict) -> list[str]:
    return shlex.split(job["spec"]["entrypoint"])


def test_the_job_runs_the_training_script_on_gpus_with_object_storage():
    from distributed_emb.config import TrainingConfig, load_config  # what train_informin parses

    cluster, job = _manifest("raycluster"), _manifest("rayjob")
    assert job["spec"]["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    text = job["spec"]["entrypoint"]
    # KubeRay appends the entrypoint to `ray job submit ... --` in a shell script: an operator
    # would run the rest on the submitter pod, not on the cluster.
    assert not re.search(r"[;&|<>`$]", text), text
    python, script, *args = _entrypoint(job)
    assert python == "python"
    assert script.endswith("jobs/train_informin.py")
    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    output = args[args.index("--output") + 1]
    assert output.startswith("/")  # on the head, where `kubectl cp` finds it
    config = load_config(
        TrainingConfig,
        str(REPO / "jobs" / "configs" / "informin_default.yaml"),  # the script's default config
        overrides,
        values={"output.dir": output},
    )
    assert config.train.use_gpu is True
    assert config.output.storage_path.startswith(("s3://", "gs://"))
    workers = config.train.num_workers  # a number, or an elastic [min, max]
    assert (min(workers) if isinstance(workers, (list, tuple)) else workers) <= _most_gpus(cluster)


def test_the_jobs_environment_is_the_runtime_env_files():
    job_env = yaml.safe_load(_manifest("rayjob")["spec"]["runtimeEnvYAML"])
    file_env = yaml.safe_load((CLUSTER / "runtime_env.yaml").read_text())
    assert job_env == {"env_vars": file_env["env_vars"]}


# --- the image ---------------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of each Dockerfile instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_the_image_copies_the_code_the_job_runs_and_installs_torch_first():
    instructions = _dockerfile()
    [workdir] = [args for op, args in instructions if op == "WORKDIR"]
    copied = []
    for op, args in instructions:
        if op == "COPY":
            *sources, _ = [a for a in args.split() if not a.startswith("--")]
            copied += sources
    for source in copied:
        assert (REPO / source).exists(), source
    _, script, *_ = _entrypoint(_manifest("rayjob"))
    relative = Path(script).relative_to(workdir)
    assert (REPO / relative).is_file() and relative.parts[0] in copied, script
    runs = [args for op, args in instructions if op == "RUN"]
    torch_at = next(i for i, run in enumerate(runs) if re.search(r"pip install .*\btorch==", run))
    [(package_at, package)] = [
        (i, run) for i, run in enumerate(runs) if re.search(r"pip install\b.*\s-e\s", run)
    ]
    assert torch_at < package_at
    assert "-c .ci/floors.txt" in package
    # The extras the launcher configs install on every node, each one pyproject.toml declares.
    extras = set(re.search(r'"\.\[([\w,]+)\]"', package).group(1).split(","))
    assert extras <= set(floors._project()["optional-dependencies"])
    for path in CONFIGS.values():
        assert f"distributed_emb[{','.join(sorted(extras))}]" in path.read_text(), path.name


def _launcher_versions() -> tuple[set[str], set[str]]:
    """(Ray pins, Python versions) in the launcher configs' node commands."""
    rays, pythons = set(), set()
    for path in CONFIGS.values():
        config = checker.load_launcher_config(path)
        for key in checker.COMMAND_KEYS:
            for command in config.get(key) or []:
                rays.update(re.findall(r"\bray\[[\w,]+\]==([\d.]+\d)", command))
                pythons.update(re.findall(r"--python (\d+\.\d+)", command))
    return rays, pythons


def image_disagreements(texts: dict[str, str], ray: str, python: str, version: str) -> list[str]:
    """Every Ray image (rayproject/ray:<Ray>-py<Python>...) and project image
    (distributed-emb:<version>-ray<Ray>-py<Python>) named in `texts` with another Ray, Python or
    project version than the ones given (`python` as in image tags: "311")."""
    found = []
    for where, text in texts.items():
        for match in RAY_IMAGE.finditer(text):
            if (match["ray"], match["python"]) != (ray, python):
                found.append(f"{where}: {match.group(0)} (Ray {ray}, py{python})")
        for match in IMAGE.finditer(text):
            if (match["version"], match["ray"], match["python"]) != (version, ray, python):
                found.append(f"{where}: {match.group(0)} ({version}, Ray {ray}, py{python})")
    return found


def _expected_versions() -> tuple[str, str, str]:
    """(Ray, Python as in image tags, project version): pyproject.toml's Ray floor (pinned
    alike in .ci/floors.txt and the launcher configs), the launcher configs' Python."""
    ray = str(floors._pyproject_floors()["ray"])
    assert floors._floors_file()["ray"] == Version(ray)
    launcher_rays, launcher_pythons = _launcher_versions()
    assert launcher_rays == {ray}, launcher_rays
    [python] = launcher_pythons  # the same Python on every node of both clouds
    assert python in SpecifierSet(floors._project()["requires-python"])
    return ray, python.replace(".", ""), floors._project()["version"]


def test_image_and_manifests_name_the_ray_floor_and_the_launchers_python():
    ray, python, version = _expected_versions()
    [base] = [args for op, args in _dockerfile() if op == "FROM"]
    match = RAY_IMAGE.fullmatch(base)
    assert match and match["platform"] == "-gpu", base
    assert image_disagreements({"FROM": base}, ray, python, version) == []

    cluster = _manifest("raycluster")
    assert cluster["spec"]["rayVersion"] == ray
    images = {c["image"] for _, c in _containers(cluster["spec"])}
    assert len(images) == 1 and IMAGE.fullmatch(images.pop()), images  # one image, every pod

    # Every image a cluster file names (the manifests, the Dockerfile's build command, the
    # launchers' commented docker block, the README) says the same.
    texts = {p.relative_to(REPO).as_posix(): text for p, text in _cluster_text_files().items()}
    assert image_disagreements(texts, ray, python, version) == []
    assert any(IMAGE.search(text) for text in texts.values())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("FROM rayproject/ray:2.59.0-py311-gpu", "x: rayproject/ray:2.59.0-py311-gpu (Ray"),
        ("#     image: rayproject/ray:2.60.0-py310-gpu", "rayproject/ray:2.60.0-py310-gpu"),
        ("image: distributed-emb:0.1.0-ray2.60.0-py312", "distributed-emb:0.1.0-ray2.60.0-py312"),
        ("image: distributed-emb:0.0.9-ray2.60.0-py311", "distributed-emb:0.0.9-ray2.60.0-py311"),
    ],
)
def test_an_image_with_another_ray_python_or_version_is_caught(text, expected):
    problems = image_disagreements({"x": text}, "2.60.0", "311", "0.1.0")
    assert any(expected in p for p in problems), problems


# --- every cluster file against pyproject.toml ------------------------------------------------


def _name_pattern(name: str) -> str:
    return "[-_.]".join(re.escape(part) for part in re.split(r"[-_.]", name))


def version_disagreements(texts: dict[str, str]) -> list[str]:
    """Every `name>=X` / `name==X` (extras allowed: `ray[...]==X`) of a pyproject.toml dependency
    whose X is not that dependency's floor: the floor is the version CI installs and tests."""
    found = []
    for name, floor in floors._pyproject_floors().items():
        pattern = re.compile(
            rf"(?<![\w.-]){_name_pattern(name)}(?:\[[^\]\s]*\])?\s*(>=|==)\s*(\d[\w.]*)",
            re.IGNORECASE,
        )
        for where, text in texts.items():
            for match in pattern.finditer(text):
                version = match.group(2).rstrip(".")
                if Version(version) != floor:
                    found.append(f"{where}: {match.group(0).rstrip('.')} (floor {name}>={floor})")
    return found


def test_every_dependency_version_in_cluster_files_is_its_floor():
    texts = {
        path.relative_to(REPO).as_posix(): text for path, text in _cluster_text_files().items()
    }
    assert version_disagreements(texts) == []
    assert any("torch==" in text for text in texts.values())  # the check has something to read


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("# the package's `torch>=2.4` is already satisfied", "x: torch>=2.4 (floor torch>=2.13)"),
        ('pip install "ray[default,train]==2.59.0"', "x: ray[default,train]==2.59.0 (floor"),
        ("pip install Sentence_Transformers>=5.0", "x: Sentence_Transformers>=5.0 (floor"),
        ("pip install boto3>=1.26", "x: boto3>=1.26 (floor boto3>=1.42.3)"),
    ],
)
def test_a_version_other_than_the_floor_is_caught(text, expected):
    assert any(expected in p for p in version_disagreements({"x": text})), expected


def _hub_switched_off(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def hub_off_settings(where: str, value) -> list[str]:
    """Where a parsed YAML document (or a command or env entry in it) switches the hub off."""
    found = []
    if isinstance(value, dict):
        if value.get("name") in HUB_SWITCHES and _hub_switched_off(value.get("value")):
            found.append(f"{where}: env {value['name']}={value.get('value')}")
        for key, item in value.items():
            if key in HUB_SWITCHES and _hub_switched_off(item):
                found.append(f"{where}.{key}: {item}")
            found += hub_off_settings(f"{where}.{key}", item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += hub_off_settings(f"{where}[{index}]", item)
    elif isinstance(value, str):
        switches = "|".join(HUB_SWITCHES)
        for match in re.finditer(rf"\b({switches})(?:=|:\s*|\s+)[\"']?(\w+)", value):
            if _hub_switched_off(match.group(2)):
                found.append(f"{where}: {match.group(0)}")
        if "\n" in value:  # a YAML document inside a string (runtimeEnvYAML)
            with contextlib.suppress(yaml.YAMLError):
                found += hub_off_settings(where, yaml.safe_load(value))
    return found


def _cluster_settings() -> dict[str, object]:
    """What the cluster files set: parsed YAML, and the Dockerfile's and scripts' code lines."""
    settings: dict[str, object] = {}
    for path, text in _cluster_text_files().items():
        name = path.relative_to(REPO).as_posix()
        if path.suffix in (".yaml", ".yml"):
            settings[name] = yaml.safe_load(text)
        elif path.name == "Dockerfile" or path.suffix == ".sh":
            code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
            settings[name] = code
    return settings


def test_nothing_in_cluster_switches_the_hub_off():
    settings = _cluster_settings()
    assert "cluster/runtime_env.yaml" in settings and "cluster/Dockerfile" in settings
    found = [p for where, value in settings.items() for p in hub_off_settings(where, value)]
    assert found == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"env_vars": {"HF_HUB_OFFLINE": "1"}}, "x.env_vars.HF_HUB_OFFLINE: 1"),
        ([{"name": "TRANSFORMERS_OFFLINE", "value": "1"}], "x[0]: env TRANSFORMERS_OFFLINE=1"),
        ({"runtimeEnvYAML": "env_vars:\n  HF_HUB_OFFLINE: 'true'\n"}, "HF_HUB_OFFLINE: true"),
        (["ENV HF_HUB_OFFLINE=1"], "x[0]: HF_HUB_OFFLINE=1"),
        (["ENV TRANSFORMERS_OFFLINE 1"], "x[0]: TRANSFORMERS_OFFLINE 1"),
        ({"setup_commands": ["export TRANSFORMERS_OFFLINE='1'; ray start"]}, "OFFLINE='1"),
    ],
)
def test_a_hub_switched_off_is_caught(value, expected):
    assert any(expected in p for p in hub_off_settings("x", value)), hub_off_settings("x", value)
    assert hub_off_settings("x", {"env_vars": {"HF_HUB_OFFLINE": "0"}}) == []
