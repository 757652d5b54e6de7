"""The package's rooms: no module imports from a layer above its own (imports inside functions
included). Read statically, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "distributed_emb"
# Every module's syntax tree, parsed once when the file is collected, before any test runs. Not
# inside a test: CPython 3.11 counts the AST builder's depth per interpreter, not per thread
# (python/cpython#106905), and Ray threads left by earlier tests in this process can run
# mid-parse (a garbage-collected dataset's usage report), which fails `ast.parse` with
# "SystemError: AST constructor recursion depth mismatch".
SYNTAX = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}

# Lowest first; a module may import its own layer and the ones below it.
LAYERS = [
    {
        "errors",
        "checks",
        "paths",
        "atomic_files",
        "tables",
        "distributed",
        "storage",
        "storage_paths",
        "console",
        "settings",
        "selection",
        "scoring",  # pair cosines and Spearman × 100: every STS number, the serving check
        "progress_report",  # the bar or the line a minute of every long piece of work
    },
    {"data", "losses"},  # what is read and what is optimised
    # Each package's own settings, declared beside it (SECTION_MODULES), read nothing above.
    {"sections", "ray_config", "logging_config"},
    {"config"},  # the loader, and the training job's composition of the sections
    {"tracking", "plots", "resource_plan", "watchdog", "runtime"},  # the run around the model
    {"model"},  # the encoder, its export and serving (the check scores through `scoring`)
    {"evaluation"},  # reads the model (its embedders); the model never reads evaluation
    {"train"},
    {"infocse", "mcr2", "tune", "vectors"},  # the methods, and embed/search/mine, over the core
    {"cli"},  # the one way into every job (jobs/ sits above it)
]
LAYER = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}
# Settings sections that live in a package above `config` but are declarations only: `config`
# composes them, so they sit below it and may read only what lies below them.
SECTION_MODULES = {
    "distributed_emb.model.model_config",
    "distributed_emb.model.export_config",
    "distributed_emb.train.train_config",
    "distributed_emb.train.output_config",
    "distributed_emb.evaluation.eval_config",
}


def room(module: str) -> str:
    """distributed_emb.train.worker → train; distributed_emb.config → config;
    distributed_emb.model.model_config → sections."""
    if module in SECTION_MODULES or module.rsplit(".", 1)[0] in SECTION_MODULES:
        return "sections"  # the module, or a name imported from it
    return module.split(".")[1]


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(SYNTAX[path]):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distributed_emb."):
            found.add(node.module)
            for alias in node.names:  # `from distributed_emb import cli`
                found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module == "distributed_emb":
            found.update(f"distributed_emb.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("distributed_emb."))
    return found


def test_every_room_has_a_layer():
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()}
    rooms = {r for r in rooms if not r.startswith(("_", ".")) and r != "resources"}
    assert rooms <= set(LAYER), f"give these a layer in LAYERS: {sorted(rooms - set(LAYER))}"


def test_no_import_runs_up_the_layers():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if module.endswith("__init__") or len(module.split(".")) < 2:
            continue
        own = LAYER[room(module)]
        for target in sorted(imports(path)):
            target_room = room(target)
            if target_room in LAYER and LAYER[target_room] > own:
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(upward)


def test_the_model_never_reads_evaluation():
    """model/ sits below evaluation/ (which embeds through it): what the model's own checks
    score with (the serving check's STS-B dev) comes from below both, data/senteval_files.py
    and scoring.py, so the two never import each other both ways."""
    assert LAYER["model"] < LAYER["evaluation"]
    found = [
        f"{path.relative_to(PACKAGE.parent)} imports {target}"
        for path in sorted((PACKAGE / "model").rglob("*.py"))
        for target in sorted(imports(path))
        if room(target) == "evaluation"
    ]
    assert not found, "\n".join(found)


# Sections of the training config that data/ must never read: it gets its own `DataConfig` and
# `StreamSettings` (data/stream_settings.py), resolved on the driver.
OTHER_SECTIONS = {"train", "model", "loss", "eval", "output", "export", "ray", "logging"}


def test_data_reads_its_own_settings_not_the_training_config():
    """No function in data/ takes an untyped `config` (the whole training config in disguise)
    or reads another section (`<name>.train`, `<name>.model`, ...)."""
    found = []
    for path in sorted((PACKAGE / "data").glob("*.py")):
        for node in ast.walk(SYNTAX[path]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                found += [
                    f"{path.name}:{node.lineno}: {node.name}({arg.arg}) has no type"
                    for arg in arguments
                    if "config" in arg.arg and arg.annotation is None
                ]
            if (
                isinstance(node, ast.Attribute)
                and node.attr in OTHER_SECTIONS
                and isinstance(node.value, ast.Name)
                and "config" in node.value.id
            ):
                found.append(f"{path.name}:{node.lineno}: reads {node.value.id}.{node.attr}")
    assert not found, "\n".join(found)


def test_no_import_circle_inside_the_package():
    """Module-level imports form no circle (imports inside functions included: a circle cut
    by a deferred import is still a circle)."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        graph[module.removesuffix(".__init__")] = {
            target for target in imports(path) if target != module
        }
    modules = set(graph)
    graph = {m: {t for t in targets if t in modules} for m, targets in graph.items()}
    circles, state = [], {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                circles.append(" → ".join(trail[trail.index(target) :] + [module, target]))
            elif target not in state:
                visit(target, trail + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not circles, "\n".join(sorted(set(circles)))


# Where the whole training config may be named: the loader, the jobs that compose a training
# run (the training driver with its resolution, identity and card; a search; InfoCSE's rounds).
# Everything else takes the sections it reads.
COMPOSITION = (
    "distributed_emb.config",
    "distributed_emb.cli",
    "distributed_emb.train.driver",
    "distributed_emb.train.resolved_run",
    "distributed_emb.train.run_identity",
    "distributed_emb.train.run_card",
    "distributed_emb.tune.",
    "distributed_emb.infocse.",
)


def test_only_the_job_composition_names_the_whole_training_config():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if module.startswith(COMPOSITION) or module in {c.rstrip(".") for c in COMPOSITION}:
            continue
        if "distributed_emb.config.TrainingConfig" in imports(path):
            found.append(f"{module} imports TrainingConfig: give its functions the sections")
    assert not found, "\n".join(found)
