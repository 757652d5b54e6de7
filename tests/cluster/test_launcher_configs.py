"""cluster/aws.yaml and cluster/gcp.yaml against Ray's own launcher schema and our security rules,
with no cloud: each rule is shown to pass on the shipped files and to catch a broken copy."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "cluster"
CONFIGS = {"aws": CLUSTER / "aws.yaml", "gcp": CLUSTER / "gcp.yaml"}


def _load_checker():
    spec = importlib.util.spec_from_file_location(
        "check_launcher_config", CLUSTER / "check_launcher_config.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = _load_checker()
NETWORK_SCRIPT = (CLUSTER / "gcp_network.sh").read_text()


@pytest.fixture(params=sorted(CONFIGS))
def shipped(request) -> dict:
    return checker.load_launcher_config(CONFIGS[request.param])


def _problems(config: dict, script: str = NETWORK_SCRIPT) -> list[str]:
    return checker.check(config, gcp_network_script=script)


def _worker_types(config: dict) -> list[str]:
    return [name for name in config["available_node_types"] if name != config["head_node_type"]]


# --- the shipped configs ---------------------------------------------------------------------


def test_shipped_configs_pass_every_check(shipped):
    assert _problems(shipped) == []


def test_shipped_configs_pass_rays_schema_directly(shipped):
    # The same calls `ray up` makes before it talks to the cloud; raises on a bad config.
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(shipped)))


def test_shipped_configs_have_gpu_workers_that_scale_from_zero(shipped):
    workers = {name: shipped["available_node_types"][name] for name in _worker_types(shipped)}
    gpus = {name: spec["resources"].get("GPU", 0) for name, spec in workers.items()}
    assert {1, 8} <= set(gpus.values())  # single-GPU nodes and an 8-GPU node
    assert all(spec.get("min_workers", 0) == 0 for spec in workers.values())
    head = shipped["available_node_types"][shipped["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0


def test_the_command_line_reports_ok_and_fails_on_a_broken_file(tmp_path, capsys):
    assert checker.main([str(CONFIGS["aws"]), str(CONFIGS["gcp"])]) == 0
    broken = checker.load_launcher_config(CONFIGS["aws"])
    broken["head_start_ray_commands"][-1] = broken["head_start_ray_commands"][-1].replace(
        "127.0.0.1", "0.0.0.0"
    )
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert checker.main([str(path)]) == 1
    assert "dashboard bound to 0.0.0.0" in capsys.readouterr().out


# --- Ray's schema ----------------------------------------------------------------------------


def test_schema_rejects_an_unknown_key_and_a_node_type_without_resources(shipped):
    unknown = copy.deepcopy(shipped)
    unknown["head_node_typo"] = "x"
    assert any("schema" in p for p in _problems(unknown))

    no_resources = copy.deepcopy(shipped)
    del no_resources["available_node_types"][_worker_types(shipped)[0]]["resources"]
    assert any("schema" in p for p in _problems(no_resources))

    too_many = copy.deepcopy(shipped)
    too_many["available_node_types"][_worker_types(shipped)[0]]["min_workers"] = 100
    assert any("schema" in p for p in _problems(too_many))  # min_workers sum > max_workers


# --- token authentication --------------------------------------------------------------------


def _replace_in_start_commands(config: dict, key: str, old: str, new: str) -> dict:
    config = copy.deepcopy(config)
    config[key] = [command.replace(old, new) for command in config[key]]
    return config


@pytest.mark.parametrize("key", ["head_start_ray_commands", "worker_start_ray_commands"])
def test_every_ray_start_must_run_with_token_auth(shipped, key):
    disabled = _replace_in_start_commands(
        shipped, key, "RAY_AUTH_MODE=token", "RAY_AUTH_MODE=disabled"
    )
    assert any(f"{key}[1]" in p and "without RAY_AUTH_MODE=token" in p for p in _problems(disabled))

    dropped = _replace_in_start_commands(shipped, key, "RAY_AUTH_MODE=token ", "")
    assert any("without RAY_AUTH_MODE=token" in p for p in _problems(dropped))

    unset_later = _replace_in_start_commands(
        shipped, key, "ulimit -n 65536;", "ulimit -n 65536; unset RAY_AUTH_MODE;"
    )
    assert any("without RAY_AUTH_MODE=token" in p for p in _problems(unset_later))


def test_the_token_file_must_reach_every_node(shipped):
    unmounted = copy.deepcopy(shipped)
    del unmounted["file_mounts"]["~/.ray/auth_token"]
    problems = _problems(unmounted)
    assert any("head_start_ray_commands[1]" in p and "not in file_mounts" in p for p in problems)
    assert any("worker_start_ray_commands[1]" in p and "not in file_mounts" in p for p in problems)

    elsewhere = _replace_in_start_commands(
        shipped, "worker_start_ray_commands", "$HOME/.ray/auth_token", "/etc/ray/token"
    )
    assert any("/etc/ray/token is not in file_mounts" in p for p in _problems(elsewhere))


def test_a_token_written_into_the_config_is_refused(shipped):
    inline = _replace_in_start_commands(
        shipped,
        "head_start_ray_commands",
        "RAY_AUTH_TOKEN_PATH=$HOME/.ray/auth_token",
        "RAY_AUTH_TOKEN=s3cret",
    )
    assert any("token is written into the config" in p for p in _problems(inline))


def test_rays_default_start_commands_are_caught(shipped):
    # Deleting our start commands makes `ray up` fall back to Ray's defaults: no token auth.
    defaults = copy.deepcopy(shipped)
    del defaults["head_start_ray_commands"], defaults["worker_start_ray_commands"]
    problems = _problems(defaults)
    assert any(p.startswith("head_start_ray_commands") for p in problems)
    assert any(p.startswith("worker_start_ray_commands") for p in problems)


def test_env_prefix_form_of_token_auth_is_understood():
    command = "ulimit -n 1; RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/t ray start --head"
    [(env, args)] = checker.ray_start_invocations(command)
    assert env == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "~/t"}
    assert args == ["--head"]
    assert checker.ray_start_invocations("echo 'ray start; x' && ray stop") == []


# --- dashboard on loopback -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("--dashboard-host=127.0.0.1", "--dashboard-host=0.0.0.0", "bound to 0.0.0.0"),
        ("--dashboard-host=127.0.0.1", "--dashboard-host 10.0.0.5", "bound to 10.0.0.5"),
        ("--dashboard-host=127.0.0.1", "", "no --dashboard-host"),
    ],
)
def test_the_dashboard_must_stay_on_loopback(shipped, old, new, expected):
    changed = _replace_in_start_commands(shipped, "head_start_ray_commands", old, new)
    assert any(expected in p for p in _problems(changed))


# --- ingress ---------------------------------------------------------------------------------


def test_ray_adds_only_ssh_from_the_world_to_its_aws_security_group():
    rules = checker.ray_default_aws_ingress([])
    world = [
        r for r in rules if any(ip.get("CidrIp") == "0.0.0.0/0" for ip in r.get("IpRanges", []))
    ]
    assert [(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in world] == [("tcp", 22, 22)]
    intra = [r for r in rules if r.get("UserIdGroupPairs")]
    assert intra and all(not r.get("IpRanges") for r in intra)


@pytest.mark.parametrize(
    "rule",
    [
        {
            "IpProtocol": "tcp",
            "FromPort": 8265,
            "ToPort": 8265,
            "IpRanges": [{"CidrIp": "0.0.0.0/0"}],
        },
        {
            "IpProtocol": "tcp",
            "FromPort": 10001,
            "ToPort": 10001,
            "Ipv6Ranges": [{"CidrIpv6": "::/0"}],
        },
        {
            "IpProtocol": "tcp",
            "FromPort": 6000,
            "ToPort": 7000,
            "IpRanges": [{"CidrIp": "0.0.0.0/0"}],
        },
        {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
    ],
)
def test_aws_rules_opening_more_than_ssh_to_the_world_are_caught(rule):
    config = checker.load_launcher_config(CONFIGS["aws"])
    config["provider"]["security_group"]["IpPermissions"] = [rule]
    assert any("open to" in p for p in _problems(config))


def test_aws_rules_for_a_private_range_or_ssh_are_allowed():
    config = checker.load_launcher_config(CONFIGS["aws"])
    private_dashboard = {"IpProtocol": "tcp", "FromPort": 8265, "ToPort": 8265}
    private_dashboard["IpRanges"] = [{"CidrIp": "10.0.0.0/8"}]
    world_ssh = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22}
    world_ssh["IpRanges"] = [{"CidrIp": "0.0.0.0/0"}]
    config["provider"]["security_group"]["IpPermissions"] = [private_dashboard, world_ssh]
    assert _problems(config) == []


def test_an_unverifiable_aws_security_group_is_caught():
    config = checker.load_launcher_config(CONFIGS["aws"])
    head = config["available_node_types"][config["head_node_type"]]
    head["node_config"]["SecurityGroupIds"] = ["sg-0123456789"]
    assert any("SecurityGroupIds set" in p for p in _problems(config))


def test_the_gcp_network_script_opens_only_ssh_to_the_world():
    rules = {rule["name"]: rule for rule in checker.gcp_firewall_rules(NETWORK_SCRIPT)}
    assert set(rules) == {"distributed-emb-ssh", "distributed-emb-internal"}
    assert rules["distributed-emb-ssh"]["allow"] == ["tcp:22"]
    assert rules["distributed-emb-ssh"]["source_ranges"] == {"0.0.0.0/0"}  # the default
    assert rules["distributed-emb-internal"]["source_ranges"] == set()
    assert rules["distributed-emb-internal"]["source_tags"] == {"distributed-emb"}


RULE = "gcloud compute firewall-rules create {} --network=distributed-emb "


@pytest.mark.parametrize(
    "extra_line",
    [
        RULE.format("dash") + "--allow=tcp:8265 --source-ranges=0.0.0.0/0",
        RULE.format("client") + "--allow=tcp:10001,tcp:22 --source-ranges=::/0",
        RULE.format("gcs") + "--allow=tcp:6379",  # no source range and no source tag: the world
        RULE.format("any") + '--allow=tcp --source-ranges="$SOMEWHERE"',  # unknown: assume world
    ],
)
def test_gcp_rules_opening_more_than_ssh_to_the_world_are_caught(extra_line):
    config = checker.load_launcher_config(CONFIGS["gcp"])
    assert any("open to" in p for p in _problems(config, NETWORK_SCRIPT + extra_line + "\n"))


def test_gcp_nodes_outside_the_scripted_network_or_tags_are_caught():
    config = checker.load_launcher_config(CONFIGS["gcp"])
    worker = config["available_node_types"][_worker_types(config)[0]]["node_config"]
    default_network = copy.deepcopy(config)
    del default_network["available_node_types"][_worker_types(config)[0]]["node_config"][
        "networkInterfaces"
    ]
    assert any("not in a network made by gcp_network.sh" in p for p in _problems(default_network))

    other_region = copy.deepcopy(config)
    other_region["provider"]["region"] = "europe-west4"
    assert any("is not the provider region" in p for p in _problems(other_region))

    untagged = copy.deepcopy(config)
    untagged["available_node_types"][_worker_types(config)[0]]["node_config"]["tags"] = {
        "items": ["something-else"]
    }
    assert any("match no intra-cluster rule" in p for p in _problems(untagged))
    assert worker["tags"]["items"] == ["distributed-emb"]  # the shipped file was not touched


# --- node types ------------------------------------------------------------------------------


def test_node_type_rules_are_enforced(shipped):
    provider = shipped["provider"]["type"]
    first = _worker_types(shipped)[0]

    warm = copy.deepcopy(shipped)
    warm["available_node_types"][first]["min_workers"] = 1
    assert any("min_workers is 1" in p for p in _problems(warm))

    gpu_head = copy.deepcopy(shipped)
    gpu_head["available_node_types"][shipped["head_node_type"]]["resources"]["GPU"] = 1
    assert any("the head has 1 GPU" in p for p in _problems(gpu_head))

    cpu_only = copy.deepcopy(shipped)
    for name in _worker_types(shipped):
        cpu_only["available_node_types"][name]["resources"].pop("GPU")
    assert "available_node_types: no worker type with a GPU" in _problems(cpu_only)

    on_demand = copy.deepcopy(shipped)
    for name in _worker_types(shipped):
        node_config = on_demand["available_node_types"][name]["node_config"]
        node_config.pop("InstanceMarketOptions", None)
        node_config.get("scheduling", {}).pop("provisioningModel", None)
    assert "available_node_types: no spot / preemptible GPU worker type" in _problems(on_demand)

    anonymous = copy.deepcopy(shipped)
    identity = "IamInstanceProfile" if provider == "aws" else "serviceAccounts"
    del anonymous["available_node_types"][first]["node_config"][identity]
    assert any("cannot write checkpoints" in p for p in _problems(anonymous))
