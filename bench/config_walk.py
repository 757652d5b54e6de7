"""How far the training config travels: from the training driver's `run_training`, follow
every call that passes the whole config on (static, nothing is imported), and count the
stops, the modules they pass through and how often the walk returns to a module it had
already left. A code-shape measure for docs/ARCHITECTURE.md, not a speed one.

    python -m bench.config_walk [--root DIR] [--start MODULE:FUNCTION] [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

# The driver's entry, then the worker's (Ray Train hands it the config as a dict); each under
# the names it has had.
DEFAULT_STARTS = (
    ("distributed_emb.train.driver:run_training", "distributed_emb.train.trainer:run_training"),
    (
        "distributed_emb.train.worker:train_loop_per_worker",
        "distributed_emb.train.loop:train_loop_per_worker",
    ),
)


class Package:
    """Every module's functions (and class methods) and what each imported name refers to."""

    def __init__(self, root: Path) -> None:
        self.functions: dict[tuple[str, str], ast.FunctionDef] = {}
        self.imports: dict[str, dict[str, str]] = {}
        self.classes: dict[tuple[str, str], ast.ClassDef] = {}
        for path in sorted((root / "distributed_emb").rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(
                ".__init__"
            )
            tree = ast.parse(path.read_text())
            names: dict[str, str] = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "distributed_emb"
                ):
                    for alias in node.names:
                        names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            self.imports[module] = names
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions[(module, node.name)] = node
                elif isinstance(node, ast.ClassDef):
                    self.classes[(module, node.name)] = node
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            self.functions[(module, f"{node.name}.{item.name}")] = item

    def resolve(self, module: str, call: ast.Call, cls: str | None) -> tuple[str, str] | None:
        func = call.func
        if isinstance(func, ast.Name):
            if (module, func.id) in self.functions:
                return module, func.id
            if (module, func.id) in self.classes:
                return module, f"{func.id}.__init__"
            target = self.imports[module].get(func.id)
            if target:
                owner, _, name = target.rpartition(".")
                if (owner, name) in self.functions:
                    return owner, name
                if (owner, name) in self.classes:
                    return owner, f"{name}.__init__"
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in ("self", "cls") and cls is not None:
                if (module, f"{cls}.{func.attr}") in self.functions:
                    return module, f"{cls}.{func.attr}"
            target = self.imports[module].get(func.value.id)  # `from pkg import module`
            if target and (target, func.attr) in self.functions:
                return target, func.attr
        return None


def receiving_parameter(node: ast.FunctionDef, call: ast.Call, carried: set[str]) -> str | None:
    """The callee's parameter that gets the carried config (a name, or `self.config`), or
    None."""
    params = [a.arg for a in node.args.posonlyargs + node.args.args]
    if params and params[0] in ("self", "cls"):
        params = params[1:]
    for index, argument in enumerate(call.args):
        if ast.unparse(argument) in carried and index < len(params):
            return params[index]
    for keyword in call.keywords:
        if ast.unparse(keyword.value) in carried:
            return keyword.arg
    return None


def carried_after_assignments(node: ast.FunctionDef, carried: set[str]) -> set[str]:
    """`self.config = config`, `run = copy(config)`, `config = from_dict(...)`: the names the
    config is held under in this function (and, for `self.<name>`, in the class's methods)."""
    carried = set(carried)
    for statement in ast.walk(node):
        if not isinstance(statement, ast.Assign):
            continue
        source = ast.unparse(statement.value)
        holds = any(name in source for name in carried) or "config_from_dict(" in source
        if not holds or isinstance(statement.value, ast.Attribute):
            continue  # `x = config.train` passes a section, not the config
        for target in statement.targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, (ast.Name, ast.Attribute)) and "config" in ast.unparse(leaf):
                    carried.add(ast.unparse(leaf))
    return carried


def walk(package: Package, start: tuple[str, str], parameter: str = "config") -> list[str]:
    """Modules of the stops, in call order (each function entered once)."""
    stops: list[str] = []
    seen: set[tuple[str, str]] = set()

    def visit(key: tuple[str, str], carried: set[str]) -> None:
        if key in seen:
            return
        seen.add(key)
        stops.append(key[0])
        module, name = key
        cls = name.split(".")[0] if "." in name else None
        node = package.functions[key]
        carried = carried_after_assignments(node, carried)
        calls = sorted(
            (n for n in ast.walk(node) if isinstance(n, ast.Call)),
            key=lambda n: (n.lineno, n.col_offset),
        )
        for call in calls:
            callee = package.resolve(module, call, cls)
            if callee is None or callee not in package.functions:
                continue
            received = receiving_parameter(package.functions[callee], call, carried)
            held_by_self = (
                callee[0] == module
                and "." in callee[1]
                and any(name.startswith("self.") for name in carried)
            )
            if received is not None:
                visit(callee, {received})
            elif held_by_self and isinstance(call.func, ast.Attribute):
                visit(callee, {name for name in carried if name.startswith("self.")})

    visit(start, {parameter})
    return stops


def returns(stops: list[str]) -> int:
    """How often the walk comes back to a module it had left."""
    count, left = 0, set()
    for previous, current in zip(stops, stops[1:]):
        if current != previous:
            left.add(previous)
            count += current in left
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    parser.add_argument("--start", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    package = Package(Path(args.root))
    choices = [(args.start,)] if args.start else DEFAULT_STARTS
    stops, starts = [], []
    for names in choices:  # each entry under the name it has in this tree
        for start in names:
            module, _, function = start.partition(":")
            if (module, function) in package.functions:
                parameter = "loop_config" if "train_loop_per_worker" in function else "config"
                stops += walk(package, (module, function), parameter)
                starts.append(start)
                break
        else:
            raise SystemExit(f"none of {names} is in {args.root}")
    result = {
        "starts": starts,
        "stops": len(stops),
        "modules": len(set(stops)),
        "returns_to_a_module_left": returns(stops),
        "data_stops": sum(stop.startswith("distributed_emb.data.") for stop in stops),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
