"""Preflight for the Ray cluster-launcher YAMLs: schema, token auth, loopback dashboard, ingress.

    python cluster/check_launcher_config.py cluster/aws.yaml cluster/gcp.yaml

Run it after editing a launcher config and before `ray up`; it needs no cloud credentials.
Exit status 1 (and one line per problem) when a config
- does not pass Ray's own launcher schema (`prepare_config` + `validate_config`, what `ray up`
  runs before it touches the cloud);
- starts Ray on any node without RAY_AUTH_MODE=token and a token file that file_mounts
  distributes (a token written into the YAML counts as a problem: it would end up in git);
- binds the head's dashboard / job API anywhere but loopback;
- lets the world (0.0.0.0/0, ::/0) reach any port but SSH 22. AWS: the rules Ray itself adds
  to the security group it creates (read from the installed Ray) plus ours. GCP: the rules in
  cluster/gcp_network.sh, for the network every node config must use;
- has a worker type with min_workers > 0, no GPU worker type, a head with GPUs, no spot /
  preemptible GPU type, or GPU workers without a cloud identity to write checkpoints with.
"""

from __future__ import annotations

import argparse
import ast
import copy
import itertools
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

WORLD = {"0.0.0.0/0", "::/0"}
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
SSH_PORT = 22
DEFAULT_TOKEN_PATH = "~/.ray/auth_token"
GCP_NETWORK_SCRIPT = Path(__file__).resolve().with_name("gcp_network.sh")
_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.DOTALL)


def load_launcher_config(path: str | Path) -> dict:
    config = yaml.safe_load(Path(path).read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{path}: top level must be a mapping")
    return config


# ---------------------------------------------------------------------------------------------
# Schema: exactly what `ray up` checks before it talks to the cloud
# ---------------------------------------------------------------------------------------------


def prepared(config: dict) -> dict:
    """The config as `ray up` sees it: Ray's provider defaults merged in, commands combined."""
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(copy.deepcopy(config))


def schema_problems(config: dict) -> list[str]:
    from ray.autoscaler._private.util import validate_config

    try:
        validate_config(prepared(config))
    except Exception as error:  # jsonschema.ValidationError, ValueError, KeyError, ...
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return [f"Ray launcher schema: {type(error).__name__}: {first_line}"]
    return []


# ---------------------------------------------------------------------------------------------
# Token authentication on every `ray start`
# ---------------------------------------------------------------------------------------------


def _statements(command: str) -> list[list[str]]:
    """Split a shell command line into statements (at ; && || | and newlines), quote-aware."""
    lexer = shlex.shlex(command.replace("\n", ";"), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    statements: list[list[str]] = [[]]
    for token in lexer:
        if set(token) <= set(";&|"):
            statements.append([])
        else:
            statements[-1].append(token)
    return [s for s in statements if s]


def ray_start_invocations(command: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, arguments) of each `ray start` in one shell command line.

    Follows `export A=b` and `unset A` across `;`, `&&` and newlines, plus `A=b ray start`
    prefixes: the environment the `ray start` process actually gets from this command.
    """
    exported: dict[str, str] = {}
    found = []
    for tokens in _statements(command):
        if tokens[0] == "export":
            for token in tokens[1:]:
                if "=" in token:
                    name, value = token.split("=", 1)
                    exported[name] = value
            continue
        if tokens[0] == "unset":
            for name in tokens[1:]:
                exported.pop(name, None)
            continue
        prefix: dict[str, str] = {}
        position = 0
        while position < len(tokens) and _ENV_ASSIGNMENT.fullmatch(tokens[position]):
            name, value = tokens[position].split("=", 1)
            prefix[name] = value
            position += 1
        if tokens[position : position + 2] == ["ray", "start"]:
            found.append(({**exported, **prefix}, tokens[position + 2 :]))
    return found


def _home_relative(path: str) -> str:
    """`$HOME/x`, `${HOME}/x` and `~/x` name the same remote file."""
    return re.sub(r"^(\$HOME|\$\{HOME\})(?=/|$)", "~", path.strip())


def token_auth_problems(config: dict) -> list[str]:
    config = prepared(config)
    mounted = {_home_relative(remote) for remote in config.get("file_mounts", {})}
    problems = []
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [
            (index, env, args)
            for index, command in enumerate(config.get(key, []))
            for env, args in ray_start_invocations(command)
        ]
        if not starts:
            problems.append(f"{key}: no `ray start` command")
        for index, env, _ in starts:
            where = f"{key}[{index}]"
            if env.get("RAY_AUTH_MODE") != "token":
                problems.append(f"{where}: `ray start` runs without RAY_AUTH_MODE=token")
                continue
            if env.get("RAY_AUTH_TOKEN"):
                problems.append(
                    f"{where}: the token is written into the config (RAY_AUTH_TOKEN); "
                    "mount a token file and point RAY_AUTH_TOKEN_PATH at it"
                )
                continue
            token_file = _home_relative(env.get("RAY_AUTH_TOKEN_PATH", DEFAULT_TOKEN_PATH))
            if token_file not in mounted:
                problems.append(
                    f"{where}: token file {token_file} is not in file_mounts, so nodes would "
                    "start without the cluster's token"
                )
    return problems


def _option(args: list[str], name: str) -> str | None:
    """Value of `--name=value` or `--name value` (last one wins, as in click)."""
    value = None
    for position, arg in enumerate(args):
        if arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
        elif arg == name and position + 1 < len(args):
            value = args[position + 1]
    return value


def dashboard_problems(config: dict) -> list[str]:
    config = prepared(config)
    problems = []
    for index, command in enumerate(config.get("head_start_ray_commands", [])):
        for _, args in ray_start_invocations(command):
            host = _option(args, "--dashboard-host")
            if host is None:
                problems.append(
                    f"head_start_ray_commands[{index}]: no --dashboard-host; bind it to "
                    "127.0.0.1 explicitly"
                )
            elif host not in LOOPBACK_HOSTS:
                problems.append(
                    f"head_start_ray_commands[{index}]: dashboard bound to {host}, not loopback"
                )
    return problems


# ---------------------------------------------------------------------------------------------
# Ingress: which ports the world can reach
# ---------------------------------------------------------------------------------------------


def ray_default_aws_ingress(extra_rules: list[dict]) -> list[dict]:
    """The IpPermissions Ray puts on the security group it creates, from the installed Ray.

    Ray's functions are lifted out of its source with `ast` because the module imports boto3,
    which a laptop without AWS tooling does not have; what runs is Ray's own code.
    """
    import ray.autoscaler

    source_path = Path(ray.autoscaler.__file__).parent / "_private" / "aws" / "config.py"
    wanted = {
        "_create_default_inbound_rules",
        "_create_default_intracluster_inbound_rules",
        "_create_default_ssh_inbound_rules",
    }
    tree = ast.parse(source_path.read_text())
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    if {f.name for f in functions} != wanted:
        raise RuntimeError(f"{source_path}: Ray's default security-group rules moved; update me")
    namespace: dict[str, Any] = {"itertools": itertools}
    exec(compile(ast.Module(body=functions, type_ignores=[]), str(source_path), "exec"), namespace)
    return namespace["_create_default_inbound_rules"]({"sg-this-cluster"}, extra_rules)


def _aws_rule_ports(rule: dict) -> tuple[int, int]:
    if str(rule.get("IpProtocol")) == "-1":
        return 0, 65535
    return int(rule.get("FromPort", 0)), int(rule.get("ToPort", 65535))


def aws_ingress_problems(config: dict) -> list[str]:
    problems = []
    for name, node_type in config.get("available_node_types", {}).items():
        if "SecurityGroupIds" in node_type.get("node_config", {}):
            problems.append(
                f"available_node_types.{name}: SecurityGroupIds set; its rules cannot be "
                "checked here (use provider.security_group)"
            )
    extra = config.get("provider", {}).get("security_group", {}).get("IpPermissions", [])
    for rule in ray_default_aws_ingress(extra):
        sources = {r.get("CidrIp") for r in rule.get("IpRanges", [])}
        sources |= {r.get("CidrIpv6") for r in rule.get("Ipv6Ranges", [])}
        open_to = sources & WORLD
        if not open_to:
            continue
        low, high = _aws_rule_ports(rule)
        if (low, high) != (SSH_PORT, SSH_PORT) or str(rule.get("IpProtocol")).lower() != "tcp":
            problems.append(
                f"security group: {rule.get('IpProtocol')} ports {low}-{high} open to "
                f"{sorted(open_to)}; only tcp:22 may be"
            )
    return problems


def _expand_shell_defaults(text: str) -> str:
    """`X="${X:-default}"` lines → substitute `$X` / `${X}` with the default.

    A variable without a default stays unexpanded; the caller treats it as "could be anything".
    """
    defaults = dict(re.findall(r'^(\w+)="\$\{\1:-([^}]*)\}"\s*$', text, flags=re.MULTILINE))
    for name, value in defaults.items():
        text = re.sub(r"\$\{" + name + r"\}|\$" + name + r"\b", value, text)
    return text


def gcp_firewall_rules(script_text: str) -> list[dict[str, Any]]:
    """The `gcloud compute firewall-rules create` calls in a shell script, as dicts."""
    rules = []
    for line in _expand_shell_defaults(script_text).splitlines():
        tokens = shlex.split(line, comments=True)
        if tokens[:4] != ["gcloud", "compute", "firewall-rules", "create"]:
            continue
        args = tokens[5:]
        rules.append(
            {
                "name": tokens[4],
                "network": _option(args, "--network") or "default",
                "direction": (_option(args, "--direction") or "INGRESS").upper(),
                "allow": (_option(args, "--allow") or "").split(","),
                "source_ranges": set(
                    filter(None, (_option(args, "--source-ranges") or "").split(","))
                ),
                "source_tags": set(filter(None, (_option(args, "--source-tags") or "").split(","))),
                "target_tags": set(filter(None, (_option(args, "--target-tags") or "").split(","))),
            }
        )
    return rules


def _gcp_allows_only_ssh(allow: list[str]) -> bool:
    return all(entry.lower() in ("tcp:22", "tcp:22-22") for entry in allow) and bool(allow)


def gcp_ingress_problems(config: dict, script_text: str) -> list[str]:
    problems = []
    rules = gcp_firewall_rules(script_text)
    networks = {rule["network"] for rule in rules}
    region = config.get("provider", {}).get("region")
    tags_by_type = {}
    for name, node_type in config.get("available_node_types", {}).items():
        node_config = node_type.get("node_config", {})
        interfaces = node_config.get("networkInterfaces") or [{}]
        subnetwork = str(interfaces[0].get("subnetwork", ""))
        match = re.search(r"regions/([^/]+)/subnetworks/([^/]+)$", subnetwork)
        if match is None or match.group(2) not in networks:
            problems.append(
                f"available_node_types.{name}: not in a network made by gcp_network.sh "
                f"(subnetwork {subnetwork or 'unset'}); Ray would pick the region's first subnet"
            )
        elif match.group(1) != region:
            problems.append(
                f"available_node_types.{name}: subnetwork region {match.group(1)} is not the "
                f"provider region {region}"
            )
        tags_by_type[name] = set(node_config.get("tags", {}).get("items", []))
    for rule in rules:
        if rule["direction"] != "INGRESS":
            continue
        # No source range and no source tag means 0.0.0.0/0 in gcloud.
        sources = rule["source_ranges"] or (set() if rule["source_tags"] else {"0.0.0.0/0"})
        unresolved = {s for s in sources if "$" in s}
        open_to = (sources & WORLD) | unresolved
        if open_to and not _gcp_allows_only_ssh(rule["allow"]):
            problems.append(
                f"firewall rule {rule['name']}: {','.join(rule['allow'])} open to "
                f"{sorted(open_to)}; only tcp:22 may be"
            )
    internal = [r for r in rules if r["source_tags"] and r["source_tags"] <= r["target_tags"]]
    for name, tags in tags_by_type.items():
        if not any(r["target_tags"] & tags for r in internal):
            problems.append(
                f"available_node_types.{name}: network tags {sorted(tags)} match no "
                "intra-cluster rule, so nodes could not reach the head's GCS"
            )
    return problems


# ---------------------------------------------------------------------------------------------
# Node types: autoscaling GPU workers, CPU head, storage identity
# ---------------------------------------------------------------------------------------------


def _is_spot(provider: str, node_config: dict) -> bool:
    if provider == "aws":
        return node_config.get("InstanceMarketOptions", {}).get("MarketType") == "spot"
    scheduling = node_config.get("scheduling", {})
    if isinstance(scheduling, list):  # Ray's own example writes it as a list of mappings
        scheduling = {k: v for item in scheduling for k, v in item.items()}
    return scheduling.get("provisioningModel") == "SPOT" or scheduling.get("preemptible") is True


def _has_storage_identity(provider: str, node_config: dict) -> bool:
    if provider == "aws":
        return "IamInstanceProfile" in node_config
    return bool(node_config.get("serviceAccounts"))


def node_type_problems(config: dict) -> list[str]:
    provider = config.get("provider", {}).get("type")
    head = config.get("head_node_type")
    problems = []
    gpu_types, spot_gpu_types = [], []
    for name, node_type in config.get("available_node_types", {}).items():
        gpus = node_type.get("resources", {}).get("GPU", 0)
        if name == head:
            if gpus:
                problems.append(f"available_node_types.{name}: the head has {gpus} GPU(s)")
            continue
        if node_type.get("min_workers", 0) != 0:
            problems.append(
                f"available_node_types.{name}: min_workers is {node_type['min_workers']}, "
                "not 0 (idle clusters should cost only the head)"
            )
        if gpus >= 1:
            gpu_types.append(name)
            node_config = node_type.get("node_config", {})
            if _is_spot(provider, node_config):
                spot_gpu_types.append(name)
            if not _has_storage_identity(provider, node_config):
                problems.append(
                    f"available_node_types.{name}: no instance profile / service account, "
                    "so workers cannot write checkpoints to storage_path"
                )
    if not gpu_types:
        problems.append("available_node_types: no worker type with a GPU")
    elif not spot_gpu_types:
        problems.append("available_node_types: no spot / preemptible GPU worker type")
    return problems


# ---------------------------------------------------------------------------------------------


def check(config: dict, gcp_network_script: str | None = None) -> list[str]:
    """Every problem found in one launcher config (empty: fit for `ray up`)."""
    problems = schema_problems(config)
    if problems:
        return problems  # the other checks assume the schema's shape
    problems += token_auth_problems(config)
    problems += dashboard_problems(config)
    provider = config["provider"]["type"]
    if provider == "aws":
        problems += aws_ingress_problems(config)
    elif provider == "gcp":
        script = gcp_network_script
        if script is None:
            script = GCP_NETWORK_SCRIPT.read_text()
        problems += gcp_ingress_problems(config, script)
    else:
        problems.append(f"provider {provider!r}: no ingress check for this provider")
    problems += node_type_problems(config)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="cluster launcher YAML files")
    args = parser.parse_args(argv)
    failed = False
    for path in args.configs:
        problems = check(load_launcher_config(path))
        for problem in problems:
            print(f"{path}: {problem}")
        if not problems:
            print(f"{path}: ok")
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
