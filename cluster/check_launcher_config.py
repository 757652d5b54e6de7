"""Preflight for the Ray cluster-launcher YAMLs: schema, token auth, loopback dashboard, ingress.

    python cluster/check_launcher_config.py cluster/aws.yaml cluster/gcp.yaml

Run it after editing a launcher config and before `ray up`; it needs no cloud credentials.
Exit status 1 (and one line per problem) when a config
- does not pass Ray's own launcher schema (`prepare_config` + `validate_config`, what `ray up`
  runs before it touches the cloud);
- starts Ray without RAY_AUTH_MODE=token and a token file that file_mounts distributes (a
  token written into the YAML counts as a problem: it would end up in git). Every `ray start`
  in every command list is checked on its own, also behind `sudo`, `env`, `nohup`, `( ... )`,
  `bash -c` or a backslash-continued line; one the checker cannot follow (inside quotes or
  `$(...)`) is a problem too;
- binds the head's dashboard / job API anywhere but loopback;
- lets public address space reach any port but SSH 22. A source range is public unless it lies
  wholly inside private, shared (100.64.0.0/10), unique-local, loopback or link-local space,
  so 0.0.0.0/1 + 128.0.0.0/1 or 2000::/3 fail like 0.0.0.0/0 and ::/0. AWS: the rules Ray
  itself adds to the security group it creates (read from the installed Ray) plus ours;
  groups named in node_config (SecurityGroupIds, NetworkInterfaces[].Groups) or brought by a
  LaunchTemplate cannot be read offline and fail. GCP: the rules in cluster/gcp_network.sh,
  for the network every node config must use. Both: rules that the config's own commands add
  (`gcloud compute firewall-rules create|update`, `aws ec2 authorize-security-group-ingress`);
- has a worker type with min_workers > 0, no GPU worker type, a head with GPUs, no spot /
  preemptible GPU type, or GPU workers without a cloud identity to write checkpoints with.
"""

from __future__ import annotations

import argparse
import ast
import copy
import ipaddress
import itertools
import json
import logging
import re
import sys
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
SSH_PORT = 22
DEFAULT_TOKEN_PATH = "~/.ray/auth_token"
GCP_NETWORK_SCRIPT = Path(__file__).resolve().with_name("gcp_network.sh")

# Sources that only hosts inside a VPC (or the node itself) can use. Deliberately a list and not
# ipaddress's is_private / is_global: those also call documentation and benchmark ranges
# private, and their lists change between Python versions.
INTERNAL_NETWORKS = tuple(
    ipaddress.ip_network(network)
    for network in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",  # shared address space: usable for VPC subnets, not routed publicly
        "127.0.0.0/8",
        "169.254.0.0/16",
        "fc00::/7",
        "fe80::/10",
        "::1/128",
    )
)
# Named in messages so a user sees what an open range exposes. Every port but tcp:22 is refused,
# these are only the ones Ray listens on with the shipped start commands.
RAY_PORTS = {
    6379: "GCS",
    8076: "object manager",
    8265: "dashboard / job API",
    10001: "client server",
    52365: "dashboard agent",
}
RAY_WORKER_PORTS = (10002, 19999)
COMMAND_KEYS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)
START_KEYS = ("head_start_ray_commands", "worker_start_ray_commands")
NODE_TYPE_COMMAND_KEYS = ("initialization_commands", "worker_setup_commands")


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
# Shell commands: enough of sh to see which programs a launcher command runs, with what env
# ---------------------------------------------------------------------------------------------


class ShellSyntaxError(ValueError):
    """A command line the checker cannot split into words (e.g. an unterminated quote)."""


class _Op(str):
    """A control operator (`;`, `&&`, `|`, `(`, newline, ...); a plain str is a word."""


_CONTROL_OPERATORS = ("&&", "||", ";;", ";&", "|&", ";", "&", "|", "(", ")", "\n")
_REDIRECTIONS = ("&>>", "&>", ">>", ">&", ">|", "<<<", "<<-", "<<", "<&", "<>", ">", "<")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
# Words that open or close a compound command; what follows them is a command.
_RESERVED = {"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done", "while", "until"}
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh"}
# Programs that run their arguments as a command, with the options that take a value.
_WRAPPERS: dict[str, set[str]] = {
    "nohup": set(),
    "setsid": set(),
    "command": set(),
    "builtin": set(),
    "time": set(),
    "exec": {"-a"},
    "nice": {"-n", "--adjustment"},
    "timeout": {"-s", "--signal", "-k", "--kill-after"},
    "stdbuf": {"-i", "-o", "-e"},
    "ionice": {"-c", "-n", "-p"},
}
_SUDO_VALUE_OPTIONS = {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T"}
_SUDO_VALUE_OPTIONS |= {"--user", "--group", "--chdir", "--host", "--prompt", "--other-user"}


def _substitution_end(text: str, start: int) -> int:
    """Index just past the `$(...)`, `${...}`, `<(...)` or backquoted text starting at start."""
    if text[start] == "`":
        position = start + 1
        while position < len(text) and text[position] != "`":
            position += 2 if text[position] == "\\" else 1
        if position >= len(text):
            raise ShellSyntaxError("unterminated ` command substitution")
        return position + 1
    opener = text[start + 1]
    closer = ")" if opener == "(" else "}"
    depth, position = 0, start + 1
    while position < len(text):
        char = text[position]
        if char == "\\":
            position += 1
        elif char == "'":
            position = text.find("'", position + 1)
            if position < 0:
                break
        elif char == opener:
            depth += 1
        elif char == closer:
            depth -= 1
            if depth == 0:
                return position + 1
        position += 1
    raise ShellSyntaxError(f"unterminated {text[start : start + 2]}")


def shell_words(command: str, comments: list[str] | None = None) -> list[str]:
    """The words (quotes removed) and control operators (`_Op`) of a sh command line.

    Backslash-newline joins lines as sh does; `#` starts a comment only at the start of a word
    (its text goes to `comments` when given); redirections and their targets are dropped;
    `$(...)`, `${...}` and backquotes stay, unexpanded, inside their word.
    """
    tokens: list[str] = []
    word: list[str] | None = None
    redirect_target = False  # the next word is where a redirection goes, not an argument
    position, length = 0, len(command)

    def add(text: str) -> None:
        nonlocal word
        if word is None:
            word = []
        word.append(text)

    def end_word() -> None:
        nonlocal word, redirect_target
        if word is not None:
            if redirect_target:
                redirect_target = False
            else:
                tokens.append("".join(word))
        word = None

    while position < length:
        char = command[position]
        if char == "\\":
            if command[position + 1 : position + 2] != "\n":  # backslash-newline: joined lines
                add(command[position + 1 : position + 2])
            position += 2
        elif char == "'":
            end = command.find("'", position + 1)
            if end < 0:
                raise ShellSyntaxError("unterminated ' quote")
            add(command[position + 1 : end])
            position = end + 1
        elif char == '"':
            add("")
            position += 1
            while True:
                if position >= length:
                    raise ShellSyntaxError('unterminated " quote')
                char = command[position]
                if char == '"':
                    position += 1
                    break
                if char == "\\" and command[position + 1 : position + 2] in tuple('$`"\\\n'):
                    if command[position + 1] != "\n":
                        add(command[position + 1])
                    position += 2
                elif command.startswith(("$(", "${"), position) or char == "`":
                    end = _substitution_end(command, position)
                    add(command[position:end])
                    position = end
                else:
                    add(char)
                    position += 1
        elif command.startswith(("$(", "${", "<(", ">("), position) or char == "`":
            end = _substitution_end(command, position)
            add(command[position:end])
            position = end
        elif char in " \t\r":
            end_word()
            position += 1
        elif char == "#" and word is None:
            newline = command.find("\n", position)
            newline = length if newline < 0 else newline
            if comments is not None:
                comments.append(command[position:newline])
            position = newline
        elif char in "<>" or command.startswith("&>", position):
            if word is not None and "".join(word).isdigit():
                word = None  # `2>`: the digits name a file descriptor
            end_word()
            operator = next(op for op in _REDIRECTIONS if command.startswith(op, position))
            position += len(operator)
            redirect_target = True
        elif char in ";&|()\n":
            end_word()
            redirect_target = False
            operator = next(op for op in _CONTROL_OPERATORS if command.startswith(op, position))
            tokens.append(_Op(operator))
            position += len(operator)
        else:
            add(char)
            position += 1
    end_word()
    return tokens


class _Shell:
    """The variables of one sh process and which of them it exports to the programs it runs."""

    def __init__(self, environment: dict[str, str]) -> None:
        self.variables = dict(environment)
        self.exported = set(environment)

    def environment(self) -> dict[str, str]:
        return {name: self.variables[name] for name in self.exported if name in self.variables}

    def declare(self, words: list[str]) -> None:
        """`export`, `declare`/`typeset` (-x), `local`, `readonly`."""
        mode = "export" if words[0] == "export" else "set"
        for arg in words[1:]:
            if arg.startswith(("-", "+")) and "=" not in arg:
                if (words[0] == "export" and arg == "-n") or (arg[0] == "+" and "x" in arg):
                    mode = "unexport"
                elif arg[0] == "-" and "x" in arg:
                    mode = "export"
                continue
            name, has_value, value = arg.partition("=")
            if has_value:
                self.variables[name] = value
            if mode == "export":
                self.exported.add(name)
            elif mode == "unexport":
                self.exported.discard(name)


def executed_commands(
    command: str, environment: dict[str, str] | None = None
) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, argv) of every program a sh command line runs, in order.

    Follows `export`/`unset`/`NAME=value` across `;`, `&&`, `||`, `|` and newlines, `A=b cmd`
    prefixes, `( ... )` subshells (their exports end with them), the wrappers `sudo` (which
    drops the environment unless -E), `env`, `nohup`, `exec`, `nice`, `timeout`, ... and the
    scripts of `bash -c` / `sh -c` / `eval`. Conditions are not evaluated: a command after
    `||` or inside `if` counts as run.
    """
    shell = _Shell(environment or {})
    saved: list[_Shell] = []
    found: list[tuple[dict[str, str], list[str]]] = []
    statement: list[str] = []
    for token in [*shell_words(command), _Op(";")]:
        if not isinstance(token, _Op):
            statement.append(token)
            continue
        _run_statement(statement, shell, found)
        statement = []
        if token == "(":
            saved.append(copy.deepcopy(shell))
        elif token == ")" and saved:
            shell = saved.pop()
    return found


def _run_statement(
    words: list[str], shell: _Shell, found: list[tuple[dict[str, str], list[str]]]
) -> None:
    words = list(words)
    while words and words[0] in _RESERVED:
        words.pop(0)
    prefix: dict[str, str] = {}
    while words and (match := _ASSIGNMENT.fullmatch(words[0])):
        prefix[match[1]] = match[2]
        words.pop(0)
    if not words:  # `A=b` alone sets a shell variable (exported if A already is)
        shell.variables.update(prefix)
    elif words[0] in ("export", "declare", "typeset", "local", "readonly"):
        shell.declare(words)
    elif words[0] == "unset":
        for name in words[1:]:
            shell.variables.pop(name, None)
            shell.exported.discard(name)
    else:
        _run_program(words, {**shell.environment(), **prefix}, found)


def _run_program(
    argv: list[str], env: dict[str, str], found: list[tuple[dict[str, str], list[str]]]
) -> None:
    while argv:
        program = Path(argv[0]).name
        if program in _WRAPPERS:
            argv = _skip_options(argv[1:], _WRAPPERS[program])
            if program == "timeout":
                argv = argv[1:]  # the duration
        elif program == "env":
            env, argv = _env_wrapper(argv[1:], env)
        elif program == "sudo":
            env, argv = _sudo_wrapper(argv[1:], env)
        elif program in _SHELLS or program == "eval":
            found.append((env, argv))
            script = " ".join(argv[1:]) if program == "eval" else _shell_script(argv[1:])
            if script is not None:
                found.extend(executed_commands(script, env))
            return
        else:
            found.append((env, argv))
            return


def _skip_options(args: list[str], takes_value: set[str]) -> list[str]:
    args = list(args)
    while args and args[0].startswith("-"):
        option = args.pop(0)
        if option == "--":
            break
        if option in takes_value and args:
            args.pop(0)
    return args


def _env_wrapper(args: list[str], env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    env, args = dict(env), list(args)
    while args:
        arg = args.pop(0)
        if arg in ("-i", "--ignore-environment", "-"):
            env = {}
        elif arg in ("-u", "--unset", "-C", "--chdir") and args:
            name = args.pop(0)
            if arg in ("-u", "--unset"):
                env.pop(name, None)
        elif arg.startswith("--unset="):
            env.pop(arg.split("=", 1)[1], None)
        elif match := _ASSIGNMENT.fullmatch(arg):
            env[match[1]] = match[2]
        elif not arg.startswith("-"):
            return env, [arg, *args]
    return env, []


def _sudo_wrapper(args: list[str], env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """sudo resets the environment (env_reset) unless -E / --preserve-env[=list]."""
    kept: dict[str, str] = {}
    args = list(args)
    while args and args[0].startswith("-"):
        option = args.pop(0)
        if option == "--":
            break
        if option in ("-E", "--preserve-env"):
            kept = dict(env)
        elif option.startswith("--preserve-env="):
            names = option.split("=", 1)[1].split(",")
            kept.update({name: env[name] for name in names if name in env})
        elif option in _SUDO_VALUE_OPTIONS and args:
            args.pop(0)
    while args and (match := _ASSIGNMENT.fullmatch(args[0])):
        kept[match[1]] = match[2]
        args.pop(0)
    return kept, args


def _shell_script(args: list[str]) -> str | None:
    """The script of `bash [options] -c SCRIPT`; None for `bash file.sh` (not visible here)."""
    position, has_c = 0, False
    while position < len(args):
        arg = args[position]
        if arg in ("-o", "+o", "-O", "+O"):
            position += 2
            continue
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg:
            has_c = True
        elif not arg.startswith(("-", "+")):
            return arg if has_c else None
        position += 1
    return None


def _mentions(pattern: re.Pattern, command: str) -> int:
    """How often `pattern` occurs in a command outside its comments, quoted or not: the
    safety net for programs hidden where `executed_commands` cannot follow them."""
    comments: list[str] = []
    shell_words(command, comments)
    joined = command.replace("\\\r\n", "").replace("\\\n", "")
    return len(pattern.findall(joined)) - sum(len(pattern.findall(c)) for c in comments)


# ---------------------------------------------------------------------------------------------
# Token authentication on every `ray start`
# ---------------------------------------------------------------------------------------------

# `ray start` anywhere in the text, quoted or not: more of these than the parser found means
# one is hidden where it cannot be checked (a string, `$(...)`, an unknown wrapper).
_RAY_START_TEXT = re.compile(r"(?<![\w.-])ray(?:\.scripts\.scripts)?(?:\s+-\S+)*\s+start(?![\w-])")
_RAY_GLOBAL_OPTIONS = {"--logging-level", "--logging-format"}


def _ray_start_args(argv: list[str]) -> list[str] | None:
    """The arguments after `ray [global options] start`, or None for any other program."""
    if not argv or Path(argv[0]).name != "ray":
        return None
    rest = list(argv[1:])
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in _RAY_GLOBAL_OPTIONS and rest:
            rest.pop(0)
    return rest[1:] if rest[:1] == ["start"] else None


def ray_start_invocations(command: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, arguments) of each `ray start` in one shell command line.

    The environment is what the `ray start` process actually gets from this command (see
    `executed_commands`). Raises ShellSyntaxError for a line sh could not parse either.
    """
    found = []
    for env, argv in executed_commands(command):
        args = _ray_start_args(argv)
        if args is not None:
            found.append((env, args))
    return found


def _command_lists(config: dict) -> list[tuple[str, list[str]]]:
    """(key, commands) of every command list `ray up` runs on nodes.

    Start commands as `ray up` sees them (Ray's defaults when missing); the setup lists as
    written, because prepare_config prepends setup_commands to head/worker_setup_commands and
    the indices in messages must match the file.
    """
    ready = prepared(config)
    lists = [
        (key, list(ready.get(key, []) if key in START_KEYS else config.get(key) or []))
        for key in COMMAND_KEYS
    ]
    for name, node_type in config.get("available_node_types", {}).items():
        for key in NODE_TYPE_COMMAND_KEYS:
            if node_type.get(key):
                lists.append((f"available_node_types.{name}.{key}", list(node_type[key])))
    return lists


def _parsed_commands(config: dict) -> list[tuple[str, str, list | ShellSyntaxError]]:
    """(where, command text, executed programs or the parse error) for every node command."""
    parsed: list[tuple[str, str, list | ShellSyntaxError]] = []
    for key, commands in _command_lists(config):
        for index, command in enumerate(commands):
            try:
                result: list | ShellSyntaxError = executed_commands(str(command))
            except ShellSyntaxError as error:
                result = error
            parsed.append((f"{key}[{index}]", str(command), result))
    return parsed


def _home_relative(path: str) -> str:
    """`$HOME/x`, `${HOME}/x` and `~/x` name the same remote file."""
    return re.sub(r"^(\$HOME|\$\{HOME\})(?=/|$)", "~", path.strip())


def _ray_starts(parsed: list) -> list[tuple[str, dict[str, str], list[str]]]:
    """(where, env, args) of every `ray start` in `_parsed_commands`; `where` names the
    command and, when it holds several, which `ray start` of it."""
    starts = []
    for where, _, executed in parsed:
        if isinstance(executed, ShellSyntaxError):
            continue
        own = [(env, _ray_start_args(argv)) for env, argv in executed]
        own = [(env, args) for env, args in own if args is not None]
        for number, (env, args) in enumerate(own, start=1):
            label = where if len(own) == 1 else f"{where} (`ray start` #{number} of {len(own)})"
            starts.append((label, env, args))
    return starts


def token_auth_problems(config: dict) -> list[str]:
    mounted = {_home_relative(remote) for remote in prepared(config).get("file_mounts", {})}
    parsed = _parsed_commands(config)
    starts = _ray_starts(parsed)
    problems = []
    for where, text, executed in parsed:
        if isinstance(executed, ShellSyntaxError):
            problems.append(f"{where}: sh could not parse this command ({executed})")
            continue
        parsed = sum(_ray_start_args(argv) is not None for _, argv in executed)
        if _mentions(_RAY_START_TEXT, text) > parsed:
            problems.append(
                f"{where}: mentions `ray start` where its environment cannot be followed "
                "(quotes, $(...), or a wrapper the checker does not know); "
                "run it as a plain command so its token auth can be checked"
            )
    for key in START_KEYS:
        if not any(where.startswith(key + "[") for where, _, _ in starts):
            problems.append(f"{key}: no `ray start` command")
    for where, env, _ in starts:
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
    """Every `ray start` in head_start_ray_commands, and any `ray start --head` elsewhere."""
    problems = []
    for where, _, args in _ray_starts(_parsed_commands(config)):
        if not (where.startswith("head_start_ray_commands[") or "--head" in args):
            continue
        host = _option(args, "--dashboard-host")
        if host is None:
            problems.append(f"{where}: no --dashboard-host; bind it to 127.0.0.1 explicitly")
        elif host not in LOOPBACK_HOSTS:
            problems.append(f"{where}: dashboard bound to {host}, not loopback")
    return problems


# ---------------------------------------------------------------------------------------------
# Ingress: which ports public address space can reach
# ---------------------------------------------------------------------------------------------


def public_sources(sources: Iterable[str]) -> list[str]:
    """The source ranges that reach beyond internal address space, as written.

    A range counts as internal only if it lies wholly inside one of INTERNAL_NETWORKS, so
    0.0.0.0/1 (or 0.0.0.0/1 + 128.0.0.0/1, or ::/1) is public like 0.0.0.0/0. A value that is
    not a network (a `$VARIABLE` the checker cannot resolve, a typo) counts as public: it
    cannot be shown to be internal.
    """
    public = []
    for source in sources:
        try:
            network = ipaddress.ip_network(str(source).strip(), strict=False)
        except ValueError:
            public.append(str(source))
            continue
        internal = any(
            network.version == block.version and network.subnet_of(block)
            for block in INTERNAL_NETWORKS
        )
        if not internal:
            public.append(str(source))
    return sorted(set(public))


_PROTOCOL_NAMES = {"6": "tcp", "17": "udp", "1": "icmp", "58": "icmpv6", "-1": "all", "all": "all"}


def _port_range_text(protocol: str, low: int, high: int) -> str:
    if protocol == "all":
        return "all traffic"
    if (low, high) in ((0, 65535), (-1, -1)):
        return protocol
    return f"{protocol}:{low}" if low == high else f"{protocol}:{low}-{high}"


def _ray_ports_note(ranges: list[tuple[str, int, int]]) -> str:
    """`, reaching Ray's GCS (6379), ...` for the Ray ports the ranges include."""
    reached = []
    for port, name in RAY_PORTS.items():
        if any(p in ("tcp", "all") and low <= port <= high for p, low, high in ranges):
            reached.append(f"{name} ({port})")
    low_worker, high_worker = RAY_WORKER_PORTS
    if any(
        p in ("tcp", "all") and low <= high_worker and high >= low_worker for p, low, high in ranges
    ):
        reached.append(f"worker ports ({low_worker}-{high_worker})")
    return f", reaching Ray's {', '.join(reached)}" if reached else ""


def _only_ssh(ranges: list[tuple[str, int, int]]) -> bool:
    return bool(ranges) and all(r == ("tcp", SSH_PORT, SSH_PORT) for r in ranges)


def _ingress_problem(
    where: str, ranges: list[tuple[str, int, int]], public: list[str]
) -> list[str]:
    if not public or _only_ssh(ranges):
        return []
    ports = ",".join(_port_range_text(*r) for r in ranges) or "(no ports given)"
    return [
        f"{where}: {ports} open to {public} (public address space){_ray_ports_note(ranges)}; "
        "only tcp:22 may be"
    ]


# --- AWS -------------------------------------------------------------------------------------


def _lift_ray_aws_functions(names: set[str]) -> dict[str, Any]:
    """Functions from Ray's AWS bootstrap, lifted out of its source with `ast`.

    The module imports boto3, which a laptop without AWS tooling does not have; what runs is
    Ray's own code, so the checker follows the installed Ray.
    """
    import ray.autoscaler

    source_path = Path(ray.autoscaler.__file__).parent / "_private" / "aws" / "config.py"
    tree = ast.parse(source_path.read_text())
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    if {f.name for f in functions} != names:
        missing = sorted(names - {f.name for f in functions})
        raise RuntimeError(f"{source_path}: Ray's {missing} moved; update me")
    namespace: dict[str, Any] = {"itertools": itertools, "copy": copy}
    namespace.update({name: getattr(typing, name) for name in ("Any", "Dict", "List")})
    exec(compile(ast.Module(body=functions, type_ignores=[]), str(source_path), "exec"), namespace)
    return namespace


def ray_default_aws_ingress(extra_rules: list[dict]) -> list[dict]:
    """The IpPermissions Ray puts on the security group it creates, from the installed Ray."""
    namespace = _lift_ray_aws_functions(
        {
            "_create_default_inbound_rules",
            "_create_default_intracluster_inbound_rules",
            "_create_default_ssh_inbound_rules",
        }
    )
    return namespace["_create_default_inbound_rules"]({"sg-this-cluster"}, extra_rules)


def aws_security_groups_of(node_config: dict) -> list[str]:
    """The security groups a node type names itself, resolved the way `ray up` does.

    Ray copies NetworkInterfaces[].Groups into SecurityGroupIds (and refuses both at once);
    any group found here means Ray creates no group for the node type and its rules are
    whatever the group in the account has. Raises ValueError where `ray up` would.
    """
    if "NetworkInterfaces" in node_config:
        namespace = _lift_ray_aws_functions(
            {
                "_configure_subnets_and_groups_from_network_interfaces",
                "_subnets_in_network_config",
                "_security_groups_in_network_config",
            }
        )
        resolve = namespace["_configure_subnets_and_groups_from_network_interfaces"]
        node_config = resolve(node_config)
    return [str(group) for group in node_config.get("SecurityGroupIds", [])]


def _aws_rule_ranges(rule: dict) -> list[tuple[str, int, int]]:
    protocol = str(rule.get("IpProtocol", "-1")).lower()
    protocol = _PROTOCOL_NAMES.get(protocol, protocol)
    if protocol == "all":
        return [("all", 0, 65535)]
    try:
        low, high = int(rule.get("FromPort", 0)), int(rule.get("ToPort", 65535))
    except (TypeError, ValueError):  # "$PORT" in a CLI call: could be any port
        low, high = 0, 65535
    if protocol in ("tcp", "udp") and (low, high) == (-1, -1):
        low, high = 0, 65535
    return [(protocol, low, high)]


def aws_rule_problems(where: str, rule: dict) -> list[str]:
    """One IpPermission: public CIDRs (IPv4 and IPv6) and prefix lists on anything but tcp:22."""
    sources = [r.get("CidrIp", "") for r in rule.get("IpRanges", [])]
    sources += [r.get("CidrIpv6", "") for r in rule.get("Ipv6Ranges", [])]
    ranges = _aws_rule_ranges(rule)
    problems = _ingress_problem(where, ranges, public_sources(sources))
    prefix_lists = [str(p.get("PrefixListId")) for p in rule.get("PrefixListIds", [])]
    if prefix_lists and not _only_ssh(ranges):
        ports = ",".join(_port_range_text(*r) for r in ranges)
        problems.append(
            f"{where}: {ports} open to prefix list(s) {prefix_lists}, whose ranges cannot be "
            "checked here; only tcp:22 may be"
        )
    return problems


def aws_ingress_problems(config: dict) -> list[str]:
    problems = []
    for name, node_type in config.get("available_node_types", {}).items():
        node_config = node_type.get("node_config", {})
        where = f"available_node_types.{name}"
        if "LaunchTemplate" in node_config:
            problems.append(
                f"{where}: LaunchTemplate set; the security groups it may bring cannot be "
                "checked here (use provider.security_group)"
            )
        try:
            groups = aws_security_groups_of(node_config)
        except ValueError as error:
            problems.append(f"{where}: `ray up` would refuse NetworkInterfaces: {error}")
            continue
        if groups:
            key = "SecurityGroupIds"
            if "NetworkInterfaces" in node_config:
                key = "NetworkInterfaces[].Groups"
            problems.append(
                f"{where}: {key} set ({', '.join(groups)}); its rules cannot be checked here "
                "(use provider.security_group)"
            )
    extra = config.get("provider", {}).get("security_group", {}).get("IpPermissions", [])
    ray_rules = len(ray_default_aws_ingress([]))
    for position, rule in enumerate(ray_default_aws_ingress(extra)):
        if position < ray_rules:
            where = f"Ray's default security-group rule {position}"
        else:
            where = f"provider.security_group.IpPermissions[{position - ray_rules}]"
        problems += aws_rule_problems(where, rule)
    return problems


_AWS_BOOLEAN_FLAGS = {"--debug", "--no-verify-ssl", "--no-paginate", "--no-cli-pager"}
_AWS_BOOLEAN_FLAGS |= {"--dry-run", "--no-dry-run", "--no-sign-request"}


def _cli_call(argv: list[str], program: str, boolean_flags: set[str]) -> tuple[list, dict]:
    """(positionals, {--flag: value}) of a gcloud/aws style command line."""
    if not argv or Path(argv[0]).name != program:
        return [], {}
    positionals, options = [], {}
    position = 1
    while position < len(argv):
        arg = argv[position]
        if arg.startswith("-"):
            flag, has_value, value = arg.partition("=")
            if not has_value and flag not in boolean_flags and position + 1 < len(argv):
                position += 1
                value = argv[position]
            options[flag] = value
        else:
            positionals.append(arg)
        position += 1
    return positionals, options


def aws_cli_ingress_rules(argv: list[str]) -> list[dict] | None:
    """The IpPermissions an `aws ec2 authorize-security-group-ingress` call adds; None if argv
    is another command. An --ip-permissions value that is neither JSON nor one shorthand
    permission raises ValueError."""
    positionals, options = _cli_call(argv, "aws", _AWS_BOOLEAN_FLAGS)
    if positionals[:2] != ["ec2", "authorize-security-group-ingress"]:
        return None
    if "--ip-permissions" in options:
        text = options["--ip-permissions"]
        try:
            value = json.loads(text)
            return value if isinstance(value, list) else [value]
        except json.JSONDecodeError:
            pass
        fields = dict(re.findall(r"(IpProtocol|FromPort|ToPort)=([-\w]+)", text))
        if "IpProtocol" not in fields:
            raise ValueError(f"cannot read --ip-permissions {text!r}")
        fields["IpRanges"] = [{"CidrIp": c} for c in re.findall(r"CidrIp=([^,}\]\s]+)", text)]
        fields["Ipv6Ranges"] = [{"CidrIpv6": c} for c in re.findall(r"CidrIpv6=([^,}\]\s]+)", text)]
        fields["PrefixListIds"] = [
            {"PrefixListId": p} for p in re.findall(r"PrefixListId=([^,}\]\s]+)", text)
        ]
        return [fields]
    protocol = options.get("--protocol", "-1")
    port = options.get("--port", "0-65535")
    low, _, high = port.partition("-") if not port.startswith("-") else (port, "", port)
    rule: dict[str, Any] = {"IpProtocol": protocol, "FromPort": low, "ToPort": high or low}
    if "--cidr" in options:
        rule["IpRanges"] = [{"CidrIp": options["--cidr"]}]
    return [rule]


# --- GCP -------------------------------------------------------------------------------------


def _expand_shell_defaults(text: str) -> str:
    """`X="${X:-default}"` lines → substitute `$X` / `${X}` with the default.

    A variable without a default stays unexpanded; the caller treats it as "could be anything".
    """
    defaults = dict(re.findall(r'^(\w+)="\$\{\1:-([^}]*)\}"\s*$', text, flags=re.MULTILINE))
    for name, value in defaults.items():
        text = re.sub(r"\$\{" + name + r"\}|\$" + name + r"\b", value, text)
    return text


_GCLOUD_BOOLEAN_FLAGS = {"--disabled", "--no-disabled", "--enable-logging", "--quiet", "-q"}
_GCLOUD_BOOLEAN_FLAGS |= {"--no-enable-logging", "--async", "--log-http"}
_GCP_RULE_FIELDS = {
    "allow": ("--allow", "--rules"),
    "source_ranges": ("--source-ranges",),
    "source_tags": ("--source-tags",),
    "target_tags": ("--target-tags",),
}
# An `update` of a rule the checker has not seen keeps sources it cannot know.
UNKNOWN_SOURCES = "<the rule's existing source ranges>"


def gcloud_firewall_rule(
    argv: list[str], where: str, known: dict[str, dict] | None = None
) -> dict[str, Any] | None:
    """The rule a `gcloud [alpha|beta] compute firewall-rules create|update NAME ...` call
    leaves in place; None for any other command (or an update that changes no field checked
    here). An update is applied to `known[NAME]`, the rule as created earlier, if there is one.
    """
    positionals, options = _cli_call(argv, "gcloud", _GCLOUD_BOOLEAN_FLAGS)
    positionals = [p for p in positionals if p not in ("alpha", "beta")]
    if positionals[:2] != ["compute", "firewall-rules"] or positionals[2:3] not in (
        ["create"],
        ["update"],
    ):
        return None
    verb, name = positionals[2], (positionals[3] if len(positionals) > 3 else "(unnamed)")
    given = {
        field: next(options[flag] for flag in flags if flag in options)
        for field, flags in _GCP_RULE_FIELDS.items()
        if any(flag in options for flag in flags)
    }
    if verb == "update":
        if not given:
            return None
        rule = copy.deepcopy((known or {}).get(name)) or {
            "network": "?",
            "direction": "INGRESS",
            "action": "ALLOW",
            "allow": ["all"],
            "source_ranges": {UNKNOWN_SOURCES},
            "source_tags": set(),
            "target_tags": set(),
        }
    else:
        rule = {
            "network": options.get("--network", "default"),
            "direction": options.get("--direction", "INGRESS").upper(),
            "action": options.get("--action", "ALLOW").upper(),
            "allow": [""],
            "source_ranges": set(),
            "source_tags": set(),
            "target_tags": set(),
        }
    for field, value in given.items():
        values = [v.strip() for v in value.split(",") if v.strip()]
        rule[field] = values if field == "allow" else set(values)
    rule.update(name=name, where=where, verb=verb)
    return rule


def _gcp_allow_ranges(allow: list[str]) -> list[tuple[str, int, int]]:
    ranges = []
    for entry in allow:
        protocol, _, ports = entry.lower().partition(":")
        protocol = _PROTOCOL_NAMES.get(protocol, protocol or "all")
        if not ports:
            ranges.append((protocol, 0, 65535))
            continue
        low, _, high = ports.partition("-")
        try:
            ranges.append((protocol, int(low), int(high or low)))
        except ValueError:  # "$PORTS": could be anything
            ranges.append((protocol, 0, 65535))
    return ranges


def gcp_rule_problems(rule: dict[str, Any]) -> list[str]:
    if rule["direction"] != "INGRESS" or rule["action"] == "DENY":
        return []
    # No source range and no source tag means 0.0.0.0/0 in gcloud.
    sources = rule["source_ranges"] or (set() if rule["source_tags"] else {"0.0.0.0/0"})
    where = f"firewall rule {rule['name']} ({rule['where']})"
    return _ingress_problem(where, _gcp_allow_ranges(rule["allow"]), public_sources(sources))


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each line, backslash-continued lines joined."""
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 1
    for number, line in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
        stripped = line.rstrip("\r")
        continued = (len(stripped) - len(stripped.rstrip("\\"))) % 2 == 1
        pending.append(stripped[:-1] if continued else stripped)
        if not continued:
            lines.append((start, " ".join(pending)))
            pending = []
    if pending:
        lines.append((start, " ".join(pending)))
    return lines


def gcp_firewall_rules(script_text: str, script_name: str = GCP_NETWORK_SCRIPT.name) -> list[dict]:
    """The firewall rules a shell script leaves in place (create, then any update), as dicts."""
    rules: dict[str, dict] = {}
    ordered: list[dict] = []
    for number, line in _logical_lines(_expand_shell_defaults(script_text)):
        try:
            executed = executed_commands(line)
        except ShellSyntaxError as error:
            raise ShellSyntaxError(f"{script_name} line {number}: {error}") from error
        for _, argv in executed:
            rule = gcloud_firewall_rule(argv, f"{script_name} line {number}", rules)
            if rule is None:
                continue
            if rule["name"] in rules:
                ordered.remove(rules[rule["name"]])
            rules[rule["name"]] = rule
            ordered.append(rule)
    return ordered


def gcp_ingress_problems(config: dict, script_text: str) -> list[str]:
    problems = []
    try:
        rules = gcp_firewall_rules(script_text)
    except ShellSyntaxError as error:
        return [f"cannot parse the network script: {error}"]
    networks = {rule["network"] for rule in rules if rule["verb"] == "create"}
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
        problems += gcp_rule_problems(rule)
    internal = [r for r in rules if r["source_tags"] and r["source_tags"] <= r["target_tags"]]
    for name, tags in tags_by_type.items():
        if not any(r["target_tags"] & tags for r in internal):
            problems.append(
                f"available_node_types.{name}: network tags {sorted(tags)} match no "
                "intra-cluster rule, so nodes could not reach the head's GCS"
            )
    return problems


# --- rules the config's own commands add -----------------------------------------------------

_FIREWALL_TEXT = re.compile(
    r"firewall-rules\s+(?:create|update)\b|authorize-security-group-ingress\b"
)


def command_ingress_problems(config: dict, known_gcp_rules: list[dict] | None = None) -> list[str]:
    """Firewall rules / security-group ingress that setup and start commands add on a node
    (any provider: a node with cloud credentials can change either cloud's network)."""
    known = {rule["name"]: rule for rule in known_gcp_rules or []}
    problems = []
    for where, text, executed in _parsed_commands(config):
        if isinstance(executed, ShellSyntaxError):
            continue  # reported by token_auth_problems
        followed = 0
        for _, argv in executed:
            rule = gcloud_firewall_rule(argv, where, known)
            if rule is not None:
                followed += 1
                problems += gcp_rule_problems(rule)
                continue
            try:
                permissions = aws_cli_ingress_rules(argv)
            except ValueError as error:
                followed += 1
                problems.append(f"{where}: security-group ingress that cannot be checked: {error}")
                continue
            if permissions is not None:
                followed += 1
                for number, permission in enumerate(permissions):
                    problems += aws_rule_problems(f"{where} ingress rule {number}", permission)
        if _mentions(_FIREWALL_TEXT, text) > followed:
            problems.append(
                f"{where}: changes firewall / security-group rules in a form the checker "
                "cannot follow; keep network rules in provider.security_group or gcp_network.sh"
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
    known_gcp_rules: list[dict] = []
    if provider == "aws":
        problems += aws_ingress_problems(config)
    elif provider == "gcp":
        script = gcp_network_script
        if script is None:
            script = GCP_NETWORK_SCRIPT.read_text()
        problems += gcp_ingress_problems(config, script)
        try:
            known_gcp_rules = gcp_firewall_rules(script)
        except ShellSyntaxError:
            pass  # reported by gcp_ingress_problems
    else:
        problems.append(f"provider {provider!r}: no ingress check for this provider")
    problems += command_ingress_problems(config, known_gcp_rules)
    problems += node_type_problems(config)
    return list(dict.fromkeys(problems))  # one line per problem, in the order found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="cluster launcher YAML files")
    args = parser.parse_args(argv)
    # prepare_config logs "setting max workers for head node type to 0" on every call.
    logging.getLogger("ray.autoscaler._private.util").setLevel(logging.WARNING)
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
