"""What every section of `python -m bench.run_all` shares: the settings, the model, the tables
and results so far, and the project's config and corpus batches in the benchmark's shape."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

from bench.machine import describe_machine, load_now
from bench.project_runs import ProjectRun, bench_texts, project_config, run_project
from bench.report import Table, markdown
from distributed_emb.config import TrainingConfig
from distributed_emb.paths import default_model_path


class BenchContext:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.model = args.model or default_model_path()
        self.output = Path(args.output)
        self.output.mkdir(parents=True, exist_ok=True)
        self.scratch = self.output / "scratch"
        self.tables: list[Table] = []
        self.results: dict = {
            "machine": describe_machine(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "settings": dict(vars(args)),
            "model": self.model,
            "load": [],
            "errors": [],
            "raw": {},
        }
        self.record_load("start")

    # ---- bookkeeping ---------------------------------------------------------------------
    def record_load(self, where: str) -> None:
        self.results["load"].append(
            {"at": where, "time": time.strftime("%H:%M:%S"), "load_1_5_15": load_now()}
        )

    def table(self, key: str, title: str, columns: list[str]) -> Table:
        """A new table, rendered in the order the sections create them."""
        table = Table(key, title, columns)
        self.tables.append(table)
        return table

    def save(self) -> None:
        self.results["tables"] = {t.key: t.as_dict() for t in self.tables}
        (self.output / "results.json").write_text(json.dumps(self.results, indent=2, default=str))
        (self.output / "results.md").write_text(self.render())

    def render(self) -> str:
        m = self.results["machine"]
        v = m["versions"]
        lines = [
            f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB RAM; python "
            f"{m['python']}, torch {v['torch']}, ray {v['ray']}, transformers "
            f"{v['transformers']}, sentence-transformers {v['sentence-transformers']}",
            f"Command: `{self.results['command']}`",
            "Load average (1, 5, 15 min): "
            + "; ".join(f"{x['at']} {x['load_1_5_15']}" for x in self.results["load"]),
            "",
        ]
        lines += [markdown(t.as_dict()) + "\n" for t in self.tables]
        if self.results["errors"]:
            lines.append(
                "Errors: "
                + "; ".join(e["section"] + ": " + e["error"] for e in self.results["errors"])
            )
        return "\n".join(lines)

    # ---- the project's training path in the benchmark's shape ----------------------------
    def project_config(
        self, workers: int, threads: int, gather: bool = True, extra: list[str] = ()
    ) -> TrainingConfig:
        a = self.args
        name = f"run_{workers}w_{int(gather)}_{len(extra)}"
        return project_config(
            self.model,
            a.batch,
            a.seq,
            workers,
            threads,
            a.warmup,
            a.steps,
            gather,
            str(self.scratch / name),
            list(extra),
        )

    def run_project(self, config: TrainingConfig) -> ProjectRun:
        """One Ray Train run of the project. Afterwards its worker and controller processes
        are given `--settle` seconds to exit, so they do not eat into the next contender's
        clock."""
        run = run_project(config, self.args.warmup)
        gc.collect()
        time.sleep(self.args.settle)
        return run

    def batches(self, count: int) -> list[list[str]]:
        """`count` batches of `--batch` corpus sentences, the rows the project's reader gives:
        the in-process contenders train on the same sentences as the project."""
        b = self.args.batch
        config = self.project_config(1, self.args.threads, extra=[f"data.max_rows={count * b}"])
        texts = bench_texts(config)
        if len(texts) < count * b:
            raise RuntimeError(f"{len(texts)} rows for {count} batches of {b}")
        return [texts[i * b : (i + 1) * b] for i in range(count)]
