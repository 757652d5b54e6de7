"""All CPU benchmarks in one run, as ratios measured side by side.

    python -m bench.run_all [--output bench_results] [--threads 1] [--rounds 3]
    python -m bench.run_all --tiny --model DIR     # seconds-scale smoke run (tests use it)

On a shared machine absolute speeds drift with everyone else's load, so every comparison is
made inside one run: contenders are interleaved (their order rotates each round), each round
gives one ratio, and the table reports medians. The load average is recorded before and
after every section. Writes results.json and results.md to --output and prints the tables.

Sections (see docs/BENCHMARKS.md): 1 training step, one worker (project vs bare PyTorch vs
sentence-transformers); 2 hardware ceiling (MFU against a matmul measured in the same run);
3 cross-worker negatives (2 workers, with and without the gather); 4 data path; 5 InfoCSE
annotation (Ray actors vs one process); 6 memory per worker; 7 where a step's time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

# Before torch, tokenizers or Ray are imported: offline, no tokenizer thread pool fighting the
# torch threads, and patience for worker start-up on a loaded machine.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "600")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from bench.machine import describe_machine, load_now, uptime_line
from bench.report import Table, markdown, median, percent, ratio

SECTIONS = ("step", "negatives", "data", "annotation", "memory", "profile")
PROJECT = "project: Ray Train worker, InforMin-CL"
PROJECT_GROUPED = "project, length-grouped batches (data.length_group_batches=16)"
BARE = "bare PyTorch loop, same math"
ST = "sentence-transformers SimCSE recipe (MNRL)"
BARE_GROUPED = "bare loop, length-grouped batches"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench_results", help="directory for JSON + markdown")
    parser.add_argument("--model", default=None, help="default: packaged all-MiniLM-L6-v2")
    parser.add_argument("--batch", type=int, default=32, help="per-worker batch (sentences)")
    parser.add_argument("--seq", type=int, default=32, help="max sequence length")
    parser.add_argument(
        "--threads",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="torch threads of every single-worker contender",
    )
    parser.add_argument("--steps", type=int, default=4, help="timed steps per contender per round")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed steps first (the project's first window)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument(
        "--negative-rounds",
        type=int,
        default=1,
        help="rounds of the 2-worker gather / no-gather pair",
    )
    parser.add_argument("--memory-batches", default="16,32,64,128")
    parser.add_argument(
        "--annotation-docs",
        type=int,
        default=60,
        help="Lee news documents to annotate (about 8.7 sentences each)",
    )
    parser.add_argument("--data-batches", type=int, default=60)
    parser.add_argument("--profile-steps", type=int, default=2)
    parser.add_argument(
        "--ab-steps",
        type=int,
        default=16,
        help="steps per variant in the step-by-step A/B (section 7c)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds to wait after each Ray Train run (its processes wind down)",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="smallest settings everywhere (smoke test with a tiny model)",
    )
    parser.add_argument("--verbose", action="store_true", help="show Ray's worker logs")
    args = parser.parse_args(argv)
    if args.tiny:
        args.batch, args.seq, args.steps, args.warmup, args.rounds = 4, 16, 1, 1, 1
        args.memory_batches, args.annotation_docs, args.data_batches = "4,8", 4, 3
        args.profile_steps, args.threads, args.settle, args.ab_steps = 1, 1, 0.0, 2
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {list(SECTIONS)}")
    return args


class Bench:
    def __init__(self, args: argparse.Namespace):
        from distributed_emb.paths import default_model_path

        self.args = args
        self.model = args.model or default_model_path()
        self.output = Path(args.output)
        self.output.mkdir(parents=True, exist_ok=True)
        self.scratch = self.output / "scratch"
        self.tables: list[Table] = []
        self.results: dict = {
            "machine": describe_machine(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "settings": {k: v for k, v in vars(args).items()},
            "model": self.model,
            "load": [],
            "errors": [],
            "raw": {},
        }
        self.load("start")

    # ---- bookkeeping --------------------------------------------------------------------
    def load(self, where: str) -> None:
        self.results["load"].append(
            {"at": where, "time": time.strftime("%H:%M:%S"), "load_1_5_15": load_now()}
        )

    def table(self, key: str, title: str, columns: list[str]) -> Table:
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

    def section(self, name: str, function) -> None:
        if name not in self.args.sections.split(","):
            return
        print(f"[bench] {name} … (load {load_now()})", flush=True)
        started = time.perf_counter()
        try:
            function()
        except Exception as error:  # one broken section must not lose the others' numbers
            traceback.print_exc()
            self.results["errors"].append({"section": name, "error": repr(error)[:500]})
        self.load(f"after {name}")
        print(f"[bench] {name} done in {time.perf_counter() - started:.0f} s", flush=True)
        self.save()

    # ---- shared pieces -------------------------------------------------------------------
    def project_config(
        self, workers: int, threads: int, gather: bool = True, extra: list[str] = ()
    ):
        from bench.project_runs import project_config

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

    def batches(self, count: int) -> list[list[str]]:
        from bench.project_runs import bench_texts

        b = self.args.batch
        config = self.project_config(1, self.args.threads, extra=[f"data.max_rows={count * b}"])
        texts = bench_texts(config)
        if len(texts) < count * b:
            raise RuntimeError(f"{len(texts)} rows for {count} batches of {b}")
        return [texts[i * b : (i + 1) * b] for i in range(count)]

    # ---- 1 + 2: training step, one worker; hardware ceiling ------------------------------
    def training_step(self) -> None:
        import torch
        from transformers import AutoConfig, AutoTokenizer

        from bench.baselines import BareLoop, SentenceTransformersRecipe
        from bench.flops import matmul_flops_per_s, training_flops_per_token
        from bench.project_runs import run_project

        a = self.args
        config = self.project_config(1, a.threads)
        grouped_config = self.project_config(1, a.threads, extra=["data.length_group_batches=16"])
        batches = self.batches(a.warmup + a.steps)
        # The timed batches regrouped among themselves: the same sentences, less padding.
        tokenizer = AutoTokenizer.from_pretrained(self.model)
        grouped = batches[: a.warmup] + length_grouped(batches[a.warmup :], tokenizer, a.seq)
        total = (a.warmup + a.steps) * a.rounds
        torch.set_num_threads(a.threads)
        loss = config.loss
        bare = BareLoop(
            self.model,
            a.seq,
            config.train.learning_rate,
            loss.temperature,
            loss.reconstruction_weight,
            total_steps=2 * total,
        )
        st = SentenceTransformersRecipe(
            self.model, a.seq, config.train.learning_rate, loss.temperature, total_steps=total
        )
        matmul = [matmul_flops_per_s(a.threads)]
        contenders = {
            PROJECT: lambda: run_project(config, a.warmup),
            PROJECT_GROUPED: lambda: run_project(grouped_config, a.warmup),
            BARE: lambda: bare.run(batches, a.warmup),
            ST: lambda: st.run(batches, a.warmup),
            BARE_GROUPED: lambda: bare.run(grouped, a.warmup),
        }
        runs: dict[str, list] = {name: [] for name in contenders}
        names = list(contenders)
        orders = []
        for round_index in range(a.rounds):
            # A fresh order each round (seeded): a fixed rotation would always put the same
            # contender right after a Ray run, while Ray's processes are still winding down.
            order = random.Random(round_index).sample(names, len(names))
            orders.append(order)
            for name in order:
                print(f"[bench]   round {round_index + 1}/{a.rounds}: {name}", flush=True)
                runs[name].append(contenders[name]())
                if name in (PROJECT, PROJECT_GROUPED):
                    settle(a.settle)
            matmul.append(matmul_flops_per_s(a.threads))
        torch.set_num_threads(a.threads)
        self.results["raw"]["step"] = {k: [vars(r) for r in v] for k, v in runs.items()}
        self.results["raw"]["step_orders"] = orders
        self.results["raw"]["matmul_flops_per_s"] = matmul
        self.project_one_worker = runs[PROJECT]

        def sps(name: str, r: int) -> float:
            return runs[name][r].sentences_per_s

        def paired(numerator: str, denominator: str) -> float:
            return median([sps(numerator, r) / sps(denominator, r) for r in range(a.rounds)])

        step = self.table(
            "training_step",
            f"1. Training step, one worker (batch {a.batch}, max length {a.seq}, {a.threads} "
            f"torch thread(s) each; median of {a.rounds} interleaved rounds × {a.steps} steps)",
            [
                "contender",
                "sentences/s",
                "tokens/s",
                "× bare loop",
                "× sentence-transformers",
                "padding",
                "data wait",
            ],
        )
        for name in names:
            rs = runs[name]
            padded = [getattr(r, "padded_tokens", None) for r in rs]
            padding = 1 - sum(r.real_tokens for r in rs) / sum(padded) if all(padded) else None
            wait = (
                median([r.data_wait_fraction for r in rs])
                if name in (PROJECT, PROJECT_GROUPED)
                else None
            )
            step.add(
                name,
                median([r.sentences_per_s for r in rs]),
                median([r.tokens_per_s for r in rs]),
                ratio(paired(name, BARE)),
                ratio(paired(name, ST)),
                percent(padding),
                percent(wait),
            )
        step.notes.append(
            "Ratios are medians of per-round ratios (each round runs every contender back to "
            "back). tokens/s counts real tokens of both views, padding excluded. The project "
            "row is the loop's own steady-state windows (evaluation and checkpoints excluded; "
            "data waits, tokenisation and Ray included); its padding is not recorded by the "
            "loop (same corpus and batch shape as the bare loop)."
        )

        model_config = AutoConfig.from_pretrained(self.model)
        ceiling = max(matmul)
        hardware = self.table(
            "hardware",
            f"2. Hardware ceiling: model FLOPs utilisation against fp32 dense matmul "
            f"({a.threads} thread(s), measured in this run: "
            f"{ceiling / 1e9:.1f} GFLOP/s)",
            ["contender", "model GFLOP/s", "matmul GFLOP/s", "MFU"],
        )
        for name in names:
            rs = runs[name]
            achieved = []
            for r in rs:
                # Mean real length of a sequence: attention FLOPs grow with it.
                length = r.tokens_per_s / (2 * r.sentences_per_s)
                per_token = training_flops_per_token(
                    model_config.hidden_size,
                    model_config.num_hidden_layers,
                    model_config.intermediate_size,
                    length,
                )
                achieved.append(r.tokens_per_s * per_token)
            flops = median(achieved)
            hardware.add(name, flops / 1e9, ceiling / 1e9, percent(flops / ceiling))
        hardware.notes.append(
            "Model FLOPs = 3 × forward matmul FLOPs of the real tokens (bench/flops.py, checked "
            "against torch.utils.flop_counter in tests/bench); padding counts as waste. The "
            "matmul rate is the best 1024² fp32 product over one second, measured at the start "
            "of the section and after each round "
            f"({', '.join(f'{m / 1e9:.1f}' for m in matmul)} GFLOP/s)."
        )

    # ---- 3: cross-worker negatives --------------------------------------------------------
    def negatives(self) -> None:
        from bench.project_runs import run_project

        a = self.args
        runs: dict[bool, list] = {True: [], False: []}
        for round_index in range(a.negative_rounds):
            order = [True, False] if round_index % 2 == 0 else [False, True]
            for gather in order:
                print(f"[bench]   2 workers, gather={gather}", flush=True)
                runs[gather].append(run_project(self.project_config(2, 1, gather), a.warmup))
                settle(a.settle)
        self.results["raw"]["negatives"] = {str(k): [vars(r) for r in v] for k, v in runs.items()}
        self.two_workers = runs
        table = self.table(
            "negatives",
            f"3. Cross-worker negatives: 2 workers × batch {a.batch}, 1 CPU and 1 torch thread "
            f"each (median of {a.negative_rounds} round(s))",
            [
                "setting",
                "step s",
                "global sentences/s",
                "negatives per row",
                "global batch",
                "× gathered",
                "data wait",
            ],
        )
        base = median([r.step_s for r in runs[True]])
        for gather, label in (
            (True, "gathered negatives (default)"),
            (False, "local negatives (loss.gather_negatives=false)"),
        ):
            rs = runs[gather]
            step_s = median([r.step_s for r in rs])
            table.add(
                label,
                step_s,
                median([r.sentences_per_s for r in rs]),
                rs[0].negatives_per_row,
                rs[0].global_batch,
                ratio(base / step_s),
                percent(median([r.data_wait_fraction for r in rs])),
            )
        table.notes.append(
            "× gathered is speed relative to the gathered run (step time ratio). Both settings "
            "train on the same global batch of sentences; the gather changes how many "
            "candidates each row's softmax sees (W·B instead of B)."
        )

    # ---- 4: data path ---------------------------------------------------------------------
    def data_path(self) -> None:
        from bench.data_path import time_data_path

        a = self.args
        timing = time_data_path(
            self.model, a.batch, a.seq, a.data_batches, ["max_rows=2000"] if a.tiny else []
        )
        self.results["raw"]["data"] = vars(timing)
        one = getattr(self, "project_one_worker", None)
        two = getattr(self, "two_workers", {}).get(True)
        consumption = median([r.sentences_per_s for r in one]) if one else None
        table = self.table(
            "data_path",
            "4. Data path: reading and tokenising against training consumption",
            ["stage", "sentences/s", "× training consumption (1 worker)", "worker data wait"],
        )

        def headroom(rate):
            return ratio(rate / consumption) if consumption else "–"

        read_rate = timing.rows / timing.read_s
        table.add(
            f"read + clean corpus ({timing.rows:,} rows, driver)",
            read_rate,
            headroom(read_rate),
            "–",
        )
        table.add(
            "Ray Data iter_torch_batches + collate (1 consumer)",
            timing.iterate_sentences_per_s,
            headroom(timing.iterate_sentences_per_s),
            "–",
        )
        table.add(
            "collate only (tokenise 2 views, no Ray)",
            timing.tokenise_sentences_per_s,
            headroom(timing.tokenise_sentences_per_s),
            "–",
        )
        if one:
            table.add(
                "training consumption, 1 worker",
                consumption,
                ratio(1.0),
                percent(median([r.data_wait_fraction for r in one])),
            )
        else:
            table.add("training consumption, 1 worker", None, "–", "–")
        if two:
            table.add(
                "training consumption, 2 workers (global)",
                median([r.sentences_per_s for r in two]),
                "–",
                percent(median([r.data_wait_fraction for r in two])),
            )
        else:
            table.add("training consumption, 2 workers (global)", None, "–", "–")
        table.notes.append(
            f"The Ray Data pipeline's first batch came after {timing.first_batch_s:.2f} s "
            "(start-up, paid once per epoch inside the first window). "
            "Worker data wait = share of the training windows' wall time spent in "
            "`next(batches)` (the loop's data_wait_s / window_s): the time compute sat idle "
            "waiting for the data path. Read + clean runs once per run on the driver."
        )

    # ---- 5: annotation --------------------------------------------------------------------
    def annotation(self) -> None:
        from bench.annotation import annotate_locally, annotate_with_ray, lee_documents

        a = self.args
        documents = lee_documents(a.annotation_docs)
        few = documents[:2]
        paths = [
            lambda docs: annotate_locally(self.model, docs, a.threads),
            lambda docs: annotate_with_ray(self.model, docs, 1, a.threads),
            lambda docs: annotate_with_ray(self.model, docs, 2, max(1, a.threads // 2)),
        ]
        # Each path twice, on 2 documents and on all: the difference removes the fixed cost
        # (actor start-up, model loads) and leaves the marginal rate of a longer round.
        runs = [(path(few), path(documents)) for path in paths]
        self.results["raw"]["annotation"] = [[vars(r) for r in pair] for pair in runs]
        table = self.table(
            "annotation",
            f"5. InfoCSE annotation: {runs[0][1].documents} Lee documents, "
            f"{runs[0][1].sentences} sentences",
            [
                "path",
                "seconds",
                "sentences/s",
                "× one process",
                "fixed cost s",
                "marginal sentences/s",
                "marginal × one process",
                "pairs",
            ],
        )

        def marginal(pair) -> float | None:
            small, full = pair
            extra = full.seconds - small.seconds
            # None when the noise of start-up swamps the extra work (tiny runs).
            return (full.sentences - small.sentences) / extra if extra > 0 else None

        def fixed(pair) -> float | None:
            small, _ = pair
            rate = marginal(pair)
            return max(0.0, small.seconds - small.sentences / rate) if rate else None

        local_rate, local_marginal = runs[0][1].sentences_per_s, marginal(runs[0])
        for pair in runs:
            full, rate = pair[1], marginal(pair)
            relative = ratio(rate / local_marginal) if rate and local_marginal else "–"
            table.add(
                full.name,
                full.seconds,
                full.sentences_per_s,
                ratio(full.sentences_per_s / local_rate),
                fixed(pair),
                rate,
                relative,
                full.pairs,
            )
        table.notes.append(
            "End to end as an InfoCSE round pays it (Ray: actor start-up, one model load per "
            "actor, Parquet writing); one actor has the same torch threads as the one "
            "process. Fixed "
            "cost and marginal rate come from a second run of each path on 2 documents: "
            "marginal = extra sentences / extra seconds, what a long round approaches."
        )

    # ---- 6: memory ------------------------------------------------------------------------
    def memory(self) -> None:
        a = self.args
        rows = []
        for batch in [int(b) for b in a.memory_batches.split(",")]:
            command = [
                sys.executable,
                str(Path(__file__).parent / "memory.py"),
                "--model",
                self.model,
                "--batch",
                str(batch),
                "--seq",
                str(a.seq),
                "--threads",
                str(a.threads),
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"memory.py --batch {batch} failed: {done.stderr[-800:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        self.results["raw"]["memory"] = rows
        table = self.table(
            "memory",
            f"6. Memory: peak RSS of one worker's step (full-length batches of {a.seq} tokens)",
            ["process", "batch", "peak RSS MB", "after building MB", "step adds MB"],
        )
        for row in rows:
            table.add(
                "fresh process, project step",
                row["batch"],
                row["peak_mb"],
                row["built_mb"],
                row["peak_mb"] - row["built_mb"],
            )
        one = getattr(self, "project_one_worker", None)
        two = getattr(self, "two_workers", {}).get(True)
        table.add(
            "Ray Train worker, 1 worker (section 1)",
            a.batch,
            max(r.peak_rss_mb for r in one) if one else None,
            None,
            None,
        )
        table.add(
            "Ray Train worker, rank 0 of 2 (section 3)",
            a.batch,
            max(r.peak_rss_mb for r in two) if two else None,
            None,
            None,
        )
        if len(rows) >= 2:
            slope = (rows[-1]["peak_mb"] - rows[0]["peak_mb"]) / (
                rows[-1]["batch"] - rows[0]["batch"]
            )
            table.notes.append(
                f"Growth: about {slope:.1f} MB per extra sentence in the batch (two views of "
                f"{a.seq} tokens each). Peaks are the process's VmHWM; the Ray worker rows "
                "are what the loop reports (`peak_rss_mb`) at each evaluation: real batches, "
                "dynamically padded, plus Ray's own buffers."
            )

    # ---- 7: profile -----------------------------------------------------------------------
    def profile(self) -> None:
        from bench.profile_step import profile_step
        from bench.step_ab import BEFORE, DEFAULT, VARIANTS, step_ab

        a = self.args
        result = profile_step(self.model, self.batches(a.profile_steps + 1), a.seq, a.threads)
        self.results["raw"]["profile"] = result
        phases = self.table(
            "profile_phases",
            f"7a. Where a step's time goes (the project's step in one process, {a.threads} "
            f"thread(s), {result['step_ms']:.0f} ms per step under the profiler)",
            ["phase", "ms per step", "share"],
        )
        for row in result["phases"]:
            phases.add(row["phase"], row["ms_per_step"], percent(row["share"]))
        top = self.table(
            "profile_operators",
            "7b. Top operators by self CPU time (torch.profiler)",
            ["operator", "calls per step", "self ms per step", "share of step"],
        )
        for row in result["top_operators"]:
            top.add(
                row["operator"],
                row["calls_per_step"],
                row["self_ms_per_step"],
                percent(row["share"]),
            )

        ab = step_ab(self.model, self.batches(a.ab_steps + 1), a.seq, a.threads)
        self.results["raw"]["speed_ab"] = ab
        table = self.table(
            "speed_ab",
            f"7c. The speed changes A/B, variants taking turns step by step in one process "
            f"({ab[DEFAULT]['steps']} steps each, {a.threads} thread(s))",
            [
                "variant",
                "ms per step",
                "optimizer ms",
                "real tokens/s",
                "× default",
                "× before",
                "padding",
            ],
        )
        for name in VARIANTS:
            row = ab[name]
            table.add(
                name,
                row["ms_per_step"],
                row["optimizer_ms_per_step"],
                row["tokens_per_s"],
                ratio(row["tokens_per_s"] / ab[DEFAULT]["tokens_per_s"]),
                ratio(row["tokens_per_s"] / ab[BEFORE]["tokens_per_s"]),
                percent(row["padding"]),
            )
        table.notes.append(
            "Speed = real tokens / summed step time (forward, loss, backward, clipping, "
            "optimizer); each variant has its own model and engine, the order rotates every "
            "step. The grouped variant trains on the same sentences, batched by "
            "LengthGroupedCollator over the whole pool."
        )

    def run(self) -> None:
        import ray

        ray.init(
            address="local",  # our own instance, whatever else runs on the machine
            # Logical CPUs above the core count: the sections run Train runs, annotation and
            # encoding pools back to back in one instance, and a section's leftovers (a Train
            # controller shutting down) must not starve the next one's Ray Data tasks.
            num_cpus=2 * (os.cpu_count() or 1),
            include_dashboard=False,
            object_store_memory=512 * 1024**2 if self.args.tiny else 1024**3,
            log_to_driver=self.args.verbose,
            runtime_env={
                "env_vars": {
                    k: os.environ[k]
                    for k in (
                        "HF_HUB_OFFLINE",
                        "TOKENIZERS_PARALLELISM",
                        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S",
                    )
                    if k in os.environ
                }
            },
        )
        started = time.perf_counter()
        try:
            self.section("step", self.training_step)
            self.section("negatives", self.negatives)
            self.section("data", self.data_path)
            self.section("annotation", self.annotation)
            self.section("memory", self.memory)
            self.section("profile", self.profile)
        finally:
            ray.shutdown()
        self.results["wall_s"] = round(time.perf_counter() - started, 1)
        self.results["uptime"] = uptime_line()
        self.save()


def settle(seconds: float) -> None:
    """Let a finished Ray Train run's worker and controller processes exit before the next
    contender's clock starts."""
    import gc

    gc.collect()
    time.sleep(seconds)


def length_grouped(
    batches: list[list[str]], tokenizer, max_length: int, seed: int = 0
) -> list[list[str]]:
    """The same sentences re-batched so each batch holds similar lengths (sorted, cut into
    batches of the same size, batch order shuffled): what length grouping would save."""
    texts = [t for batch in batches for t in batch]
    lengths = [min(len(ids), max_length) for ids in tokenizer(texts)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    size = len(batches[0])
    grouped = [[texts[i] for i in order[s : s + size]] for s in range(0, len(order), size)]
    random.Random(seed).shuffle(grouped)
    return grouped


def main(argv: list[str] | None = None) -> int:
    bench = Bench(parse_args(argv))
    bench.run()
    print(bench.render())
    print(
        f"\n[bench] wrote {bench.output / 'results.json'} and {bench.output / 'results.md'} "
        f"in {bench.results['wall_s']:.0f} s"
    )
    return 1 if bench.results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
