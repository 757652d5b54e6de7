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


# --- mutation tests: one change to a shipped file, one named failure ------------------------
#
# Each case starts from the shipped aws.yaml / gcp.yaml, changes one thing and expects a
# problem line that names the rule or command. Before issue 15 the checker printed "ok" for
# most of them, crashed on the unterminated quote, and caught the rest (the second `ray start`
# cases, a public dashboard) only under another name or not per command.


def _permission(protocol, low, high, v4=(), v6=(), prefix_lists=()):
    rule = {"IpProtocol": protocol, "FromPort": low, "ToPort": high}
    if v4:
        rule["IpRanges"] = [{"CidrIp": cidr} for cidr in v4]
    if v6:
        rule["Ipv6Ranges"] = [{"CidrIpv6": cidr} for cidr in v6]
    if prefix_lists:
        rule["PrefixListIds"] = [{"PrefixListId": p} for p in prefix_lists]
    return rule


def _add_permission(rule):
    def mutate(config):
        config["provider"]["security_group"]["IpPermissions"].append(rule)

    return mutate


def _set_node_config(node_type, key, value):
    def mutate(config):
        config["available_node_types"][node_type]["node_config"][key] = value

    return mutate


def _append_command(key, command):
    def mutate(config):
        config[key].append(command)

    return mutate


def _edit_command(key, index, old, new):
    def mutate(config):
        assert old in config[key][index], (key, index, old)
        config[key][index] = config[key][index].replace(old, new)

    return mutate


def _set_command(key, index, command):
    def mutate(config):
        config[key][index] = command

    return mutate


def _node_type_command(node_type, key, command):
    def mutate(config):
        config["available_node_types"][node_type][key] = [command]

    return mutate


TOKEN_EXPORT = "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$HOME/.ray/auth_token"
HEAD_START = "ray start --head --port=6379 --dashboard-host=127.0.0.1 --dashboard-port=8265"
WORKER_START = "ray start --address=$RAY_HEAD_IP:6379"
NO_TOKEN = "`ray start` runs without RAY_AUTH_MODE=token"

MUTATIONS = {
    # AWS security group: CIDRs compared as networks, IPv4 and IPv6
    "aws-dashboard-to-two-halves-of-ipv4": (
        "aws",
        _add_permission(_permission("tcp", 8265, 8265, v4=["0.0.0.0/1", "128.0.0.0/1"])),
        "provider.security_group.IpPermissions[0]: tcp:8265 open to "
        "['0.0.0.0/1', '128.0.0.0/1'] (public address space)",
    ),
    "aws-gcs-to-upper-half-of-ipv4": (
        "aws",
        _add_permission(_permission("tcp", 6379, 6379, v4=["128.0.0.0/1"])),
        "IpPermissions[0]: tcp:6379 open to ['128.0.0.0/1'] (public address space), "
        "reaching Ray's GCS (6379)",
    ),
    "aws-client-to-ipv6-world": (
        "aws",
        _add_permission(_permission("tcp", 10001, 10001, v6=["::/0"])),
        "IpPermissions[0]: tcp:10001 open to ['::/0']",
    ),
    "aws-worker-ports-to-ipv6-global-unicast": (
        "aws",
        _add_permission(_permission("tcp", 10002, 19999, v6=["2000::/3"])),
        "IpPermissions[0]: tcp:10002-19999 open to ['2000::/3']",
    ),
    "aws-dashboard-to-one-address": (
        # 203.0.113.0/24 is a documentation range: ipaddress calls it private, it is not ours
        "aws",
        _add_permission(_permission("tcp", 8265, 8265, v4=["203.0.113.7/32"])),
        "IpPermissions[0]: tcp:8265 open to ['203.0.113.7/32']",
    ),
    "aws-all-traffic-next-to-a-private-range": (
        "aws",
        _add_permission(_permission("-1", -1, -1, v4=["10.0.0.0/8", "0.0.0.0/1"])),
        "IpPermissions[0]: all traffic open to ['0.0.0.0/1']",
    ),
    "aws-dashboard-to-a-prefix-list": (
        "aws",
        _add_permission(_permission("tcp", 8265, 8265, prefix_lists=["pl-0123"])),
        "IpPermissions[0]: tcp:8265 open to prefix list(s) ['pl-0123']",
    ),
    # AWS: groups Ray does not create
    "aws-groups-through-network-interfaces": (
        "aws",
        _set_node_config(
            "gpu_1x_l4",
            "NetworkInterfaces",
            [{"DeviceIndex": 0, "SubnetId": "subnet-1", "Groups": ["sg-0abc"]}],
        ),
        "available_node_types.gpu_1x_l4: NetworkInterfaces[].Groups set (sg-0abc); "
        "its rules cannot be checked here",
    ),
    "aws-network-interface-without-groups": (
        "aws",
        _set_node_config("head_cpu", "NetworkInterfaces", [{"DeviceIndex": 0, "SubnetId": "s"}]),
        "available_node_types.head_cpu: `ray up` would refuse NetworkInterfaces",
    ),
    "aws-launch-template": (
        "aws",
        _set_node_config("gpu_1x_a10g", "LaunchTemplate", {"LaunchTemplateName": "lt"}),
        "available_node_types.gpu_1x_a10g: LaunchTemplate set",
    ),
    # ingress added by the config's own commands
    "aws-cli-ingress-in-setup-commands": (
        "aws",
        _append_command(
            "setup_commands",
            "aws ec2 authorize-security-group-ingress --group-name distributed-emb-ray "
            "--protocol tcp --port 8265 --cidr 0.0.0.0/1",
        ),
        "setup_commands[6] ingress rule 0: tcp:8265 open to ['0.0.0.0/1']",
    ),
    "aws-cli-ipv6-ingress-as-json": (
        "aws",
        _append_command(
            "head_setup_commands",
            "aws ec2 authorize-security-group-ingress --group-id sg-1 --ip-permissions "
            """'[{"IpProtocol": "tcp", "FromPort": 6379, "ToPort": 6379, """
            """"Ipv6Ranges": [{"CidrIpv6": "::/0"}]}]'""",
        ),
        "head_setup_commands[3] ingress rule 0: tcp:6379 open to ['::/0']",
    ),
    "gcloud-rule-in-head-setup-commands": (
        "gcp",
        _append_command(
            "head_setup_commands",
            "gcloud compute firewall-rules create dash --network=distributed-emb "
            "--allow=tcp:8265 --source-ranges=0.0.0.0/0",
        ),
        "firewall rule dash (head_setup_commands[3]): tcp:8265 open to ['0.0.0.0/0']",
    ),
    "gcloud-port-range-backslash-continued": (
        "gcp",
        _append_command(
            "setup_commands",
            "gcloud compute firewall-rules create ray-range \\\n"
            "    --network=distributed-emb \\\n"
            "    --allow=tcp:8000-9000 \\\n"
            "    --source-ranges=0.0.0.0/0\n",
        ),
        "firewall rule ray-range (setup_commands[6]): tcp:8000-9000 open to ['0.0.0.0/0'] "
        "(public address space), reaching Ray's object manager (8076), dashboard / job API "
        "(8265); only tcp:22 may be",
    ),
    "gcloud-under-sudo-in-worker-setup-ipv6": (
        "gcp",
        _append_command(
            "worker_setup_commands",
            "sudo gcloud beta compute firewall-rules create client --allow tcp:10001 "
            "--source-ranges ::/1",
        ),
        "firewall rule client (worker_setup_commands[3]): tcp:10001 open to ['::/1']",
    ),
    "gcloud-update-widens-the-ssh-rule": (
        "gcp",
        _append_command(
            "head_setup_commands",
            "gcloud compute firewall-rules update distributed-emb-ssh --allow=tcp:22,tcp:8265",
        ),
        "firewall rule distributed-emb-ssh (head_setup_commands[3]): tcp:22,tcp:8265 open to "
        "['0.0.0.0/0']",
    ),
    "gcloud-rule-in-a-node-type-command-list": (
        "gcp",
        _node_type_command(
            "gpu_1x_l4",
            "worker_setup_commands",
            "bash -c 'gcloud compute firewall-rules create w --allow=all'",
        ),
        "firewall rule w (available_node_types.gpu_1x_l4.worker_setup_commands[0]): "
        "all traffic open to ['0.0.0.0/0']",
    ),
    "gcloud-rule-hidden-in-command-substitution": (
        "gcp",
        _append_command(
            "setup_commands",
            "echo $(gcloud compute firewall-rules create x --allow=tcp:8265)",
        ),
        "setup_commands[6]: changes firewall / security-group rules in a form the checker "
        "cannot follow",
    ),
    "gcloud-rule-in-an-aws-config": (
        "aws",
        _append_command(
            "head_setup_commands",
            "gcloud compute firewall-rules create dash --allow=tcp:8265",
        ),
        "firewall rule dash (head_setup_commands[3]): tcp:8265 open to ['0.0.0.0/0']",
    ),
    # every `ray start`, each with its own environment
    "second-ray-start-in-its-own-list-entry": (
        "aws",
        _append_command("worker_start_ray_commands", WORKER_START),
        f"worker_start_ray_commands[2]: {NO_TOKEN}",
    ),
    "second-ray-start-after-an-env-prefix-one": (
        "gcp",
        _set_command(
            "worker_start_ray_commands",
            1,
            f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~/.ray/auth_token {WORKER_START} "
            f"&& {WORKER_START} --port=6380",
        ),
        f"worker_start_ray_commands[1] (`ray start` #2 of 2): {NO_TOKEN}",
    ),
    "second-ray-start-under-sudo": (
        # sudo resets the environment: the exported token settings do not reach ray
        "aws",
        _append_command("worker_start_ray_commands", f"{TOKEN_EXPORT}; sudo {WORKER_START}"),
        f"worker_start_ray_commands[2]: {NO_TOKEN}",
    ),
    "second-ray-start-under-env-unset-and-nohup": (
        "gcp",
        _append_command(
            "head_start_ray_commands",
            f"{TOKEN_EXPORT}; nohup env -u RAY_AUTH_MODE {HEAD_START} --port=6380",
        ),
        f"head_start_ray_commands[2]: {NO_TOKEN}",
    ),
    "ray-start-in-a-subshell-that-unsets-the-mode": (
        "aws",
        _edit_command(
            "worker_start_ray_commands",
            1,
            "--disable-usage-stats",
            f"--disable-usage-stats; (unset RAY_AUTH_MODE; {WORKER_START} --port=6380)",
        ),
        f"worker_start_ray_commands[1] (`ray start` #2 of 2): {NO_TOKEN}",
    ),
    "exported-mode-reassigned-before-ray-start": (
        "aws",
        _edit_command("head_start_ray_commands", 1, "ulimit", "RAY_AUTH_MODE=disabled; ulimit"),
        f"head_start_ray_commands[1]: {NO_TOKEN}",
    ),
    "exported-mode-unexported-before-ray-start": (
        "gcp",
        _edit_command("head_start_ray_commands", 1, "ulimit", "export -n RAY_AUTH_MODE; ulimit"),
        f"head_start_ray_commands[1]: {NO_TOKEN}",
    ),
    "ray-start-after-a-hash-inside-a-word": (
        # shlex took `#` inside a word for a comment and hid everything after it
        "aws",
        _append_command(
            "worker_start_ray_commands",
            f"{TOKEN_EXPORT}; echo a#b; unset RAY_AUTH_MODE; {WORKER_START}",
        ),
        f"worker_start_ray_commands[2]: {NO_TOKEN}",
    ),
    "ray-start-in-bash-c-with-a-cleared-environment": (
        "gcp",
        _append_command("worker_start_ray_commands", f"env -i bash -c '{WORKER_START}'"),
        f"worker_start_ray_commands[2]: {NO_TOKEN}",
    ),
    "ray-start-in-head-setup-commands": (
        "aws",
        _append_command("head_setup_commands", HEAD_START),
        f"head_setup_commands[3]: {NO_TOKEN}",
    ),
    "ray-start-in-command-substitution": (
        "gcp",
        _append_command("head_start_ray_commands", f"{TOKEN_EXPORT}; echo $({HEAD_START})"),
        "head_start_ray_commands[2]: mentions `ray start` where its environment cannot be followed",
    ),
    "second-head-ray-start-on-a-public-dashboard": (
        "aws",
        _edit_command(
            "head_start_ray_commands",
            1,
            "--disable-usage-stats",
            "--disable-usage-stats && ray start --head --port=6380 --dashboard-host=0.0.0.0",
        ),
        "head_start_ray_commands[1] (`ray start` #2 of 2): dashboard bound to 0.0.0.0",
    ),
    "public-dashboard-on-a-backslash-continued-line": (
        "gcp",
        _set_command(
            "head_start_ray_commands",
            1,
            f"{TOKEN_EXPORT}\nray start --head --port=6379 \\\n  --dashboard-host=0.0.0.0\n",
        ),
        "head_start_ray_commands[1]: dashboard bound to 0.0.0.0, not loopback",
    ),
    "unterminated-quote": (
        "aws",
        _edit_command("worker_start_ray_commands", 1, "ulimit -n 65536", "echo 'ulimit -n 65536"),
        "worker_start_ray_commands[1]: sh could not parse this command (unterminated ' quote)",
    ),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_a_single_mutation_of_a_shipped_config_is_named(case):
    name, mutate, expected = MUTATIONS[case]
    config = checker.load_launcher_config(CONFIGS[name])
    assert _problems(config) == []  # the starting point passes
    mutate(config)
    problems = _problems(config)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("extra_line", "expected"),
    [
        (
            RULE.format("halves") + "--allow=tcp:8265 --source-ranges=0.0.0.0/1,128.0.0.0/1",
            "firewall rule halves (gcp_network.sh line 24): tcp:8265 open to "
            "['0.0.0.0/1', '128.0.0.0/1']",
        ),
        (
            "gcloud compute firewall-rules create ranged \\\n  --network=distributed-emb \\\n"
            "  --allow=tcp:8000-9000 --source-ranges=::/0",
            "firewall rule ranged (gcp_network.sh line 24): tcp:8000-9000 open to ['::/0']",
        ),
        (
            "gcloud compute firewall-rules update distributed-emb-internal "
            "--source-ranges=0.0.0.0/0",
            "firewall rule distributed-emb-internal (gcp_network.sh line 24): tcp,udp,icmp open "
            "to ['0.0.0.0/0']",
        ),
    ],
)
def test_gcp_network_script_rules_are_read_as_networks_across_lines(extra_line, expected):
    config = checker.load_launcher_config(CONFIGS["gcp"])
    problems = _problems(config, NETWORK_SCRIPT + extra_line + "\n")
    assert any(expected in p for p in problems), problems


def _literal_block(command: str) -> str:
    """The shipped one-line start command as a YAML `|` block: one option per line."""
    return command.replace("; ", ";\n").replace(" --", " \\\n    --") + "\n"


@pytest.mark.parametrize("trailing_backslash", [False, True])
def test_backslash_continued_start_commands_are_joined_before_parsing(shipped, trailing_backslash):
    # The shlex-based checker lost every option after the first continuation ("no
    # --dashboard-host") and crashed on a trailing backslash ("No escaped character").
    multiline = copy.deepcopy(shipped)
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        command = _literal_block(multiline[key][1])
        multiline[key][1] = command.rstrip("\n") + " \\\n" if trailing_backslash else command
    assert "\\\n" in multiline["head_start_ray_commands"][1]
    [(env, args)] = checker.ray_start_invocations(multiline["head_start_ray_commands"][1])
    assert "--dashboard-host=127.0.0.1" in args and env["RAY_AUTH_MODE"] == "token"
    assert _problems(multiline) == []


@pytest.mark.parametrize(
    "command",
    [
        f"{TOKEN_EXPORT}; sudo -E {HEAD_START}",
        f"env RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$HOME/.ray/auth_token {HEAD_START}",
        f"{TOKEN_EXPORT}; nohup bash -c '{HEAD_START}' > ray.log 2>&1",
        f"{TOKEN_EXPORT}; ( {HEAD_START} ) && ~/venv/bin/ray status",
        f"{TOKEN_EXPORT}\n# ray start lives below\n{HEAD_START}",
    ],
)
def test_wrapped_ray_starts_that_keep_the_token_pass(command):
    config = checker.load_launcher_config(CONFIGS["aws"])
    config["head_start_ray_commands"][1] = command
    assert _problems(config) == []


@pytest.mark.parametrize(
    ("sources", "public"),
    [
        (["10.0.0.0/8", "172.16.0.0/12", "192.168.1.0/24", "100.64.0.0/10"], []),
        (["127.0.0.1/32", "169.254.169.254/32", "fd00::/8", "fe80::/10", "::1/128"], []),
        (["0.0.0.0/0", "0.0.0.0/1", "128.0.0.0/1", "10.0.0.0/7"], None),
        (["::/0", "::/1", "2000::/3", "0::/0", "::ffff:0:0/96"], None),
        (["203.0.113.0/24", "198.51.100.7/32", "$SOMEWHERE", "not-a-cidr"], None),
    ],
)
def test_only_ranges_wholly_inside_internal_space_are_private(sources, public):
    assert checker.public_sources(sources) == (sorted(sources) if public is None else public)


def test_private_sources_on_ray_ports_pass_on_both_clouds():
    aws = checker.load_launcher_config(CONFIGS["aws"])
    aws["provider"]["security_group"]["IpPermissions"] = [
        _permission("tcp", 8265, 8265, v4=["10.0.0.0/8", "100.64.0.0/10"], v6=["fd00::/8"]),
        _permission("tcp", 22, 22, v4=["0.0.0.0/1", "128.0.0.0/1"], v6=["::/0"]),
    ]
    aws["setup_commands"].append(
        "aws ec2 authorize-security-group-ingress --group-name distributed-emb-ray "
        "--protocol tcp --port 6379 --cidr 172.16.0.0/12"
    )
    assert _problems(aws) == []
    gcp = checker.load_launcher_config(CONFIGS["gcp"])
    gcp["head_setup_commands"].append(
        "gcloud compute firewall-rules create internal-dash --network=distributed-emb \\\n"
        "  --allow=tcp:8265 --source-ranges=10.20.0.0/20"
    )
    assert _problems(gcp) == []


def test_the_command_line_prints_one_line_per_problem(tmp_path, capsys):
    broken = checker.load_launcher_config(CONFIGS["aws"])
    _add_permission(_permission("tcp", 8265, 8265, v4=["0.0.0.0/1", "128.0.0.0/1"]))(broken)
    _append_command("worker_start_ray_commands", WORKER_START)(broken)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    assert checker.main([str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"{path}: worker_start_ray_commands[2]: {NO_TOKEN}",
        f"{path}: provider.security_group.IpPermissions[0]: tcp:8265 open to "
        "['0.0.0.0/1', '128.0.0.0/1'] (public address space), reaching Ray's dashboard / job "
        "API (8265); only tcp:22 may be",
    ]
