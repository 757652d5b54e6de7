"""The embed job's layout, decided from a described cluster (no Ray): one CPU node, several
nodes, GPUs, and the settings that override it."""

from __future__ import annotations

import pytest

from distributed_emb.resource_plan import ClusterShape, Node
from distributed_emb.vectors.embed_config import EmbedConfig
from distributed_emb.vectors.embed_layout import choose_layout


def layout(nodes: list[Node], **settings):
    return choose_layout(ClusterShape(nodes), EmbedConfig(**settings))


def shape(chosen) -> tuple:
    return (
        chosen.concurrency,
        chosen.threads,
        chosen.num_cpus_per_actor,
        chosen.num_gpus_per_actor,
    )


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [(2, (1, 2, 1.0, 0.0)), (16, (1, 16, 15.0, 0.0)), (1, (1, 1, 0.25, 0.0))],
)
def test_one_cpu_node_gets_one_actor_with_every_core(cpus, expected):
    """Every core as the one actor's threads; its reservation leaves a whole CPU to the read
    tasks (a 1-CPU node: the least reservation)."""
    chosen = layout([Node(cpus)])
    assert shape(chosen) == expected
    assert chosen.line.startswith(f"layout: one CPU node ({cpus} CPU): one actor")
    assert f"1 actor × {cpus} torch thread" in chosen.line
    assert "\n" not in chosen.line


def test_several_cpu_nodes_get_one_actor_each_sized_by_the_smallest():
    # A head that offers no CPUs (ray start --num-cpus=0) runs no actor.
    chosen = layout([Node(8), Node(8), Node(4), Node(0.0, name="head")])
    assert shape(chosen) == (3, 4, 3.0, 0.0)
    assert "3 CPU nodes (smallest 4 CPU): one actor per node" in chosen.line


def test_gpus_get_one_actor_each_sharing_their_node_s_cpus():
    chosen = layout([Node(8, 2), Node(8, 2), Node(4)])
    assert shape(chosen) == (4, 4, 3.5, 1.0)
    assert "4 GPUs on 2 nodes: one actor per GPU" in chosen.line
    # Four GPUs on a 4-CPU node: each actor a share of the 3 CPUs left, one thread.
    assert shape(layout([Node(4, 4)])) == (4, 1, 0.75, 1.0)


def test_an_onnx_backend_runs_on_the_cpus_even_where_there_are_gpus():
    chosen = layout([Node(8, 2)], backend="onnx_int8")
    assert shape(chosen) == (1, 8, 7.0, 0.0)
    assert "8 onnxruntime threads" in chosen.line and "(onnx_int8;" in chosen.line


def test_concurrency_and_threads_override_the_layout():
    # Two actors on one 2-core node share its cores and the CPU left: the layout before #56.
    chosen = layout([Node(2)], concurrency=2)
    assert shape(chosen) == (2, 1, 0.5, 0.0)
    assert "embed.concurrency as set" in chosen.line
    chosen = layout([Node(8), Node(8)], concurrency=4, torch_threads=3)
    assert shape(chosen) == (4, 3, 3.5, 0.0)  # two a node
    assert "embed.concurrency, embed.torch_threads as set" in chosen.line
    # More actors than GPUs: CPU actors, as embed.num_gpus_per_actor=null always meant.
    assert shape(layout([Node(8, 2)], concurrency=4)) == (4, 2, 1.75, 0.0)
    # Fewer: on GPUs still.
    assert shape(layout([Node(8, 2)], concurrency=1)) == (1, 4, 3.5, 1.0)
    assert shape(layout([Node(8, 2)], num_gpus_per_actor=0)) == (1, 8, 7.0, 0.0)
    assert shape(layout([Node(2)], num_cpus_per_actor=0.5)) == (1, 2, 0.5, 0.0)
